"""The kinds of field a plan step can carry, each with what it means and how it is checked.

Validation checks only what a plan *says* (types, ranges, handles that exist), never what torch will do with
it: that is the model's job. Every check bounds sizes, so a hostile file cannot make meshsim allocate, recurse
or wait without end.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import TypeGuard, cast

from ..core.deadlines import MAX_S
from ..core.errors import InputError


class PlanError(InputError):
    """A plan that says something impossible (unknown op, unknown handle, bad rank, ...)."""


MAX_NUMEL = 1 << 20  # elements of a collective's tensor: enough to see a size mismatch, small enough for 8 ranks
MAX_MESH_NUMEL = 1 << 20  # a mesh asked for on purpose beyond the world (expect_error) stays this small
MAX_DEPTH = 8  # nesting of a layout: DeviceMesh meshes have at most a handful of dims
MAX_INT = 1 << 31
_REF = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\.(\d{1,6}))?")  # a handle, or h.N for an all_submeshes list

# What an op leaves behind under its `out` handle.
PRODUCES_MESH = "mesh"
PRODUCES_MESH_LIST = "mesh_list"
PRODUCES_GROUP = "group"
PRODUCES_DTENSOR = "dtensor"

QUERIES = ("get_group", "get_all_groups", "get_local_rank", "get_coordinate", "size", "shape", "ndim", "mesh",
           "mesh_dim_names", "group_desc", "default_group", "root_mesh_dim", "device_type", "current",
           "dim_by_name", "bound_device_id")
DEVICES = ("cpu", "cuda", "cpu:0", "cuda:0")
BACKENDS = ("gloo",)  # what backend_override may name: the one every tier's CPU ranks have


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def layout_shape(value: object, depth: int = 0) -> tuple[int, ...] | None:
    """The shape of a rectangular nested list of ints, or None when it is ragged, too deep or not ints."""
    if is_int(value):
        return ()
    if not isinstance(value, list) or not value or depth >= MAX_DEPTH:
        return None
    shapes = {layout_shape(v, depth + 1) for v in value}
    if len(shapes) != 1 or None in shapes:
        return None
    inner = shapes.pop()
    assert inner is not None  # (None was refused above)
    if inner == () and not all(is_int(v) for v in value):
        return None
    return (len(value),) + inner


def flatten_layout(value: object) -> list[int]:
    if is_int(value):
        return [value]
    return [r for v in cast(Iterable[object], value) for r in flatten_layout(v)]  # validated nested lists


class Context:
    """What a field check may know: the world, the handles defined so far, whether the step means to fail."""

    def __init__(self, world: int | None, handles: dict[str, str], expect_error: bool, no_backend: bool = False):
        self.world, self.handles, self.expect_error = world, handles, expect_error
        self.no_backend = no_backend  # a mesh built without groups may name ranks beyond the world

    def rank(self, what: str, rank: object) -> None:
        if not is_int(rank):
            raise PlanError(f"{what} must be a rank number, got {rank!r}")
        if rank < 0 or (self.world is not None and rank >= self.world):
            limit = f"0..{self.world - 1}" if self.world is not None else ">= 0"
            raise PlanError(f"{what}: rank {rank} is not in the world ({limit})")

    def ranks(self, what: str, ranks: object) -> None:
        if not isinstance(ranks, (list, tuple)):
            raise PlanError(f"{what} must be a list of ranks, got {ranks!r}")
        for rank in ranks:
            self.rank(what, rank)

    def ref(self, where: str, ref: object, allowed: tuple[str, ...]) -> None:
        if not isinstance(ref, str):
            raise PlanError(f"{where} must be a handle name, got {ref!r}")
        match = _REF.fullmatch(ref)
        if not match or match.group(1) not in self.handles:
            known = ", ".join(sorted(self.handles)) or "none yet"
            raise PlanError(f"unknown handle {ref!r} (defined so far: {known})")
        produced = self.handles[match.group(1)]
        indexed = match.group(2) is not None
        if indexed and produced != PRODUCES_MESH_LIST:
            raise PlanError(f"{ref!r}: only all_submeshes results can be indexed")
        if produced == PRODUCES_MESH_LIST and not indexed:
            raise PlanError(f"{ref!r} is a list of meshes: name one as {ref}.0, {ref}.1, ...")
        if produced not in allowed:
            raise PlanError(f"{ref!r} is a {produced or 'value'}, not a {' or '.join(allowed)}")


def _shape(name: str, value: object, ctx: Context) -> None:
    if not isinstance(value, list) or not value or not all(is_int(v) and 1 <= v <= MAX_INT for v in value) \
            or len(value) > MAX_DEPTH:
        raise PlanError(f"field {name!r} must be a non-empty list of at most {MAX_DEPTH} positive integers, "
                        f"got {value!r}")
    numel = math.prod(value)
    if name == "shape" and ctx.world is not None and numel > ctx.world and not ctx.expect_error:
        raise PlanError(f"shape {value} needs {numel} ranks but the world has {ctx.world}"
                        " (set expect_error = true if that is the point)")
    if numel > MAX_MESH_NUMEL:
        raise PlanError(f"field {name!r}: {value} has {numel} cells; meshsim takes at most {MAX_MESH_NUMEL}")


def _names(name: str, value: object, ctx: Context) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > MAX_DEPTH:
        raise PlanError(f"field {name!r} must be a list of at most {MAX_DEPTH} strings, got {value!r}")


def _name_or_names(name: str, value: object, ctx: Context) -> None:
    if not (isinstance(value, str) or (isinstance(value, list) and value and len(value) <= MAX_DEPTH
                                       and all(isinstance(v, str) for v in value))):
        raise PlanError(f"field {name!r} must be a name or a non-empty list of names, got {value!r}")


def _text(name: str, value: object, ctx: Context) -> None:
    if not isinstance(value, str):
        raise PlanError(f"field {name!r} must be a string, got {value!r}")


def _dim(name: str, value: object, ctx: Context) -> None:
    if not (isinstance(value, str) or (is_int(value) and abs(value) <= MAX_INT)):
        raise PlanError(f"field {name!r} must be a dim index or a dim name, got {value!r}")


def _dims(name: str, value: object, ctx: Context) -> None:
    if not isinstance(value, list) or not value or len(value) > MAX_DEPTH:
        raise PlanError(f"field {name!r} must be a non-empty list of dim indices or names, got {value!r}")
    for item in value:
        _dim(name, item, ctx)


def _layout(name: str, value: object, ctx: Context) -> None:
    shape = layout_shape(value)
    if not shape:
        raise PlanError(f"field {name!r} must be a rectangular nested list of integers at most {MAX_DEPTH} deep, "
                        f"got {str(value)[:80]}")
    if math.prod(shape) > MAX_MESH_NUMEL:
        raise PlanError(f"field {name!r} has {math.prod(shape)} cells; meshsim takes at most {MAX_MESH_NUMEL}")
    for rank in flatten_layout(value):
        beyond_ok = ctx.expect_error or ctx.no_backend
        if rank < 0 or (ctx.world is not None and rank >= ctx.world and not beyond_ok) or rank > MAX_INT:
            raise PlanError(f"layout names rank {rank}, which is not in the world (0..{(ctx.world or 1) - 1})")


def _mesh(name: str, value: object, ctx: Context) -> None:
    ctx.ref(f"field {name!r}", value, (PRODUCES_MESH, PRODUCES_MESH_LIST))


def _meshes(name: str, value: object, ctx: Context) -> None:
    if not isinstance(value, list) or not value or len(value) > MAX_DEPTH:
        raise PlanError(f"field {name!r} must be a non-empty list of mesh handles, got {value!r}")
    for ref in value:
        _mesh(name, ref, ctx)


def _group(name: str, value: object, ctx: Context) -> None:
    ctx.ref(f"field {name!r}", value, (PRODUCES_GROUP,))


def _group_choices(name: str, value: object, ctx: Context) -> None:
    if not isinstance(value, list) or len(value) > MAX_DEPTH or not all(
            isinstance(v, list) and v and len(v) <= MAX_INT for v in value):
        raise PlanError(f"field {name!r} must be a list (one per dim) of non-empty lists of group "
                        f"handles, got {str(value)[:80]}")
    for choices in value:
        for ref in choices:
            _group(name, ref, ctx)


def _overrides(name: str, value: object, ctx: Context) -> None:
    if not isinstance(value, list) or len(value) > MAX_DEPTH or not all(
            isinstance(pair, list) and len(pair) == 2 and (isinstance(pair[0], str) or is_int(pair[0]))
            and pair[1] in BACKENDS for pair in value):
        raise PlanError(f"field {name!r} must be a list of [dim index or name, backend] pairs with backend one of "
                        f"{', '.join(BACKENDS)}, got {str(value)[:80]}")


def _tensor_shape(name: str, value: object, ctx: Context) -> None:
    from .placements import MAX_DTENSOR_DIMS, MAX_DTENSOR_NUMEL

    if not isinstance(value, list) or not value or len(value) > MAX_DTENSOR_DIMS or not all(
            is_int(v) and 0 <= v <= MAX_DTENSOR_NUMEL for v in value) or math.prod(value) > MAX_DTENSOR_NUMEL:
        raise PlanError(f"field {name!r} must be a tensor shape: 1 to {MAX_DTENSOR_DIMS} sizes (0 allowed) of at most "
                        f"{MAX_DTENSOR_NUMEL} elements in all, got {str(value)[:80]}")


def _placements(name: str, value: object, ctx: Context) -> None:
    from .placements import parse_placement

    if not isinstance(value, list) or not value or len(value) > MAX_DEPTH:
        raise PlanError(f"field {name!r} must be a list with one placement per mesh dim, got {str(value)[:80]}")
    for text in value:
        try:
            parse_placement(text)
        except ValueError as exc:
            raise PlanError(f"field {name!r}: {exc}") from None


def _dtensor(name: str, value: object, ctx: Context) -> None:
    ctx.ref(f"field {name!r}", value, (PRODUCES_DTENSOR,))


def _ranks(name: str, value: object, ctx: Context) -> None:
    ctx.ranks(f"field {name!r}", value)
    if not value:
        raise PlanError(f"field {name!r} must name at least one rank")


def _nested_ints(name: str, value: object, ctx: Context, depth: int = 0, low: int = 1) -> int:
    """An int, or a non-empty list of nested ones (the sizes or strides of a layout); returns how many ints."""
    if is_int(value):
        if not low <= value <= MAX_INT:
            raise PlanError(f"field {name!r}: {value} is not an integer from {low} to {MAX_INT}")
        return 1
    if not isinstance(value, list) or not value or depth >= MAX_DEPTH:
        raise PlanError(f"field {name!r} must be an integer or a non-empty nested list of them, at most {MAX_DEPTH} "
                        f"deep, got {str(value)[:80]}")
    count = sum(_nested_ints(name, v, ctx, depth + 1, low) for v in value)
    if count > MAX_DEPTH * MAX_DEPTH:
        raise PlanError(f"field {name!r} has {count} dims; a layout takes at most {MAX_DEPTH * MAX_DEPTH}")
    return count


def _layout_sizes(name: str, value: object, ctx: Context) -> None:
    _nested_ints(name, value, ctx)
    if math.prod(flatten_layout(value)) > MAX_MESH_NUMEL:
        raise PlanError(f"field {name!r}: a layout of more than {MAX_MESH_NUMEL} positions")


def _layout_strides(name: str, value: object, ctx: Context) -> None:
    _nested_ints(name, value, ctx, low=0)


def _rank_map(name: str, value: object, ctx: Context) -> None:
    if not isinstance(value, list) or not value or len(value) > MAX_MESH_NUMEL or not all(
            is_int(v) and 0 <= v <= MAX_INT for v in value):
        raise PlanError(f"field {name!r} must be a non-empty list of ranks (integers from 0), got {str(value)[:80]}")


def _seconds(name: str, value: object, ctx: Context) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_S:
        raise PlanError(f"field {name!r} must be a number of seconds from 0 to {MAX_S:g}, got {value!r}")


def _bounded_int(low: int, high: int) -> Callable[[str, object, Context], None]:
    def check(name: str, value: object, ctx: Context) -> None:
        if not is_int(value) or not low <= value <= high:
            raise PlanError(f"field {name!r} must be an integer from {low} to {high}, got {value!r}")

    return check


def _bool(name: str, value: object, ctx: Context) -> None:
    if not isinstance(value, bool):
        raise PlanError(f"field {name!r} must be true or false, got {value!r}")


def _one_of(choices: tuple[str, ...]) -> Callable[[str, object, Context], None]:
    def check(name: str, value: object, ctx: Context) -> None:
        if value not in choices:
            raise PlanError(f"field {name!r} must be one of {', '.join(choices)}, got {value!r}")

    return check


def _src_data_rank(name: str, value: object, ctx: Context) -> None:
    if value != "none" and not (is_int(value) and 0 <= value <= MAX_INT):
        raise PlanError(f"field {name!r} must be a group rank (0 or more) or \"none\", got {value!r}")


class Kind:
    """A kind of field: what it means (for the plan-language reference) and its check."""

    def __init__(self, meaning: str, check: Callable[[str, object, Context], None]):
        self.meaning, self.check = meaning, check


SHAPE = Kind("list of positive integers", _shape)
NAMES = Kind("list of dim names", _names)
NAME_OR_NAMES = Kind("a dim name or a list of them", _name_or_names)
NAME = Kind("a name", _text)
TEXT = Kind("text", _text)
DIM = Kind("a dim index (negative counts from the end) or a dim name", _dim)
DIMS = Kind("list of dim indices or names", _dims)
LAYOUT = Kind("nested list of ranks (rectangular)", _layout)
MESH = Kind("a mesh handle (out of an earlier step; `h.0` for an all_submeshes list)", _mesh)
MESHES = Kind("list of mesh handles", _meshes)
GROUP = Kind("a process-group handle (out of new_group)", _group)
OVERRIDES = Kind("backend_override as [[dim index or name, \"gloo\"], ...]", _overrides)
GROUP_CHOICES = Kind("one list of new_group handles per dim: each rank takes the first group it is a member of",
                     _group_choices)
TENSOR_SHAPE = Kind("a tensor shape: list of sizes (0 allowed), at most 4 dims and 4096 elements", _tensor_shape)
PLACEMENTS = Kind('one placement per mesh dim: "S(dim)", "R" or "P(sum|avg|max|min)" (torch\'s str() of them)',
                  _placements)
DTENSOR = Kind("a DTensor handle (out of distribute, redistribute, from_local or sum)", _dtensor)
TENSOR_DIM = Kind("a tensor dim (negative counts from the end)", _bounded_int(-8, 7))
RANKS = Kind("list of world ranks", _ranks)
SECONDS = Kind(f"seconds, 0 to {MAX_S:g}", _seconds)
NUMEL = Kind(f"tensor length, 1 to {MAX_NUMEL}", _bounded_int(1, MAX_NUMEL))
GROUP_RANK = Kind(f"a rank within the group, 0 to {MAX_INT}", _bounded_int(0, MAX_INT))
EXIT_CODE = Kind("exit code, 0 to 255", _bounded_int(0, 255))
BOOL = Kind("true or false", _bool)
LAYOUT_SIZES = Kind("an integer or a nested list of positive integers", _layout_sizes)
LAYOUT_STRIDES = Kind("an integer or a nested list of integers (0 allowed), shaped as sizes", _layout_strides)
RANK_MAP = Kind("list of ranks (any integers from 0: a rank map need not be the world)", _rank_map)
LAYOUT_QUERIES = ("sizes_and_strides", "all_ranks_from_zero", "complement", "global_ranks", "check_orthogonal",
                  "check_sorted", "composition", "remap_to_tensor")
LAYOUT_QUERY = Kind("one of " + ", ".join(LAYOUT_QUERIES), _one_of(LAYOUT_QUERIES))
WORLD = Kind(f"a world size, 1 to {MAX_MESH_NUMEL}", _bounded_int(1, MAX_MESH_NUMEL))
QUERY = Kind("one of " + ", ".join(QUERIES), _one_of(QUERIES))
SRC_DATA_RANK = Kind('a group rank on every mesh dim (default 0), or "none": each rank keeps its own data',
                     _src_data_rank)
MESH_SOURCES = ("argument", "context", "none")
MESH_FROM = Kind('where a DTensor call takes its mesh: "argument" (default), "context" (`with mesh:` around a call '
                 'that passes none) or "none" (passes none, outside any `with`: torch refuses)', _one_of(MESH_SOURCES))
DTYPES = ("float32", "float64")
DTYPE = Kind("one of " + ", ".join(DTYPES), _one_of(DTYPES))
DEVICE = Kind("cpu, cuda, cpu:0 or cuda:0 (the mesh's device type; default: the backend's)", _one_of(DEVICES))
