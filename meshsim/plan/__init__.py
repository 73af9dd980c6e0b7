"""Plans: pure data that every rank runs step by step (SPMD), with optional per-rank divergence."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import tomli_w
import tomllib

from . import ops as O
from .ops import OPS, STEP_KEYS, OpSpec

__all__ = ["Plan", "Step", "PlanError", "step", "validate", "OPS"]

_HANDLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REF = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\.(\d+))?$")


class PlanError(ValueError):
    """A plan that says something impossible (unknown op, unknown handle, bad rank, ...)."""


@dataclass(frozen=True)
class Step:
    op: str
    args: Mapping[str, Any] = field(default_factory=dict)
    out: str | None = None
    only_on: tuple[int, ...] | None = None  # run only on these ranks
    skip_on: tuple[int, ...] = ()  # every rank but these
    on_rank: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)  # per-rank field overrides
    expect_error: bool = False  # the author means this step to raise

    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    def runs_on(self, rank: int) -> bool:
        if rank in self.skip_on:
            return False
        return self.only_on is None or rank in self.only_on

    def args_for(self, rank: int) -> dict[str, Any]:
        merged = dict(self.args)
        merged.update(self.on_rank.get(rank, {}))
        return merged

    @property
    def diverges(self) -> bool:
        """Whether some ranks run this step differently from others (or not at all)."""
        return bool(self.only_on is not None or self.skip_on or self.on_rank)

    def divergent_ranks(self, world: int) -> set[int]:
        """The ranks at fault when this step's divergence hangs a run.

        Group creation needs every rank, so those that skip it are at fault; for anything else, the
        minority that does something the others do not.
        """
        runs = {r for r in range(world) if self.runs_on(r)}
        skipped = set(range(world)) - runs
        odd = set(self.on_rank) & runs
        if self.spec.creates_groups or len(runs) * 2 > world:
            return odd | skipped
        return odd | runs

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        out.update(self.args)
        if self.out is not None:
            out["out"] = self.out
        if self.only_on is not None:
            out["only_on"] = list(self.only_on)
        if self.skip_on:
            out["skip_on"] = list(self.skip_on)
        if self.on_rank:
            out["on_rank"] = {str(r): dict(v) for r, v in sorted(self.on_rank.items())}
        if self.expect_error:
            out["expect_error"] = True
        return out

    def __repr__(self) -> str:
        parts = [repr(self.op)] + [f"{k}={v!r}" for k, v in self.args.items()]
        for key in ("out", "only_on", "skip_on", "on_rank", "expect_error"):
            value = getattr(self, key)
            if value not in (None, (), {}, False):
                parts.append(f"{key}={list(value) if isinstance(value, tuple) else value!r}")
        return f"step({', '.join(parts)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    def describe(self) -> str:
        """One line, as a person would write the call."""
        args = ", ".join(f"{k}={_short(v)}" for k, v in self.args.items())
        text = f"{self.out} = {self.op}({args})" if self.out else f"{self.op}({args})"
        if self.only_on is not None:
            text += f" only on {list(self.only_on)}"
        if self.skip_on:
            text += f" skipped on {list(self.skip_on)}"
        for rank, over in sorted(self.on_rank.items()):
            text += f"; on rank {rank}: " + ", ".join(f"{k}={_short(v)}" for k, v in over.items())
        return text


def _short(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else repr(value)


def step(op: str, **kwargs: Any) -> Step:
    """step("slice", src="m", names=["tp"], out="s") -- the keyword form plans are written in."""
    meta = {k: kwargs.pop(k) for k in STEP_KEYS if k in kwargs}
    return _step_from(op, {k: v for k, v in kwargs.items() if v is not None}, meta)


def _step_from(op: str, args: dict[str, Any], meta: Mapping[str, Any]) -> Step:
    on_rank = meta.get("on_rank") or {}
    return Step(
        op=op,
        args=args,
        out=meta.get("out"),
        only_on=None if meta.get("only_on") is None else tuple(meta["only_on"]),
        skip_on=tuple(meta.get("skip_on") or ()),
        on_rank={_rank_key(k): dict(v) for k, v in on_rank.items()} if isinstance(on_rank, Mapping) else on_rank,
        expect_error=bool(meta.get("expect_error", False)),
    )


def _rank_key(key: Any) -> Any:
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    return key


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        inner = ",\n    ".join(repr(s) for s in self.steps)
        return f"Plan((\n    {inner},\n))"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # Hypothesis prints falsifying plans this way: eval-able, one step a line

    @property
    def diverges(self) -> bool:
        return any(s.diverges for s in self.steps)

    def divergent_ranks(self, world: int) -> set[int]:
        """The ranks at fault for the plan's divergence (see Step.divergent_ranks)."""
        return {r for s in self.steps if s.diverges for r in s.divergent_ranks(world)}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": [s.to_dict() for s in self.steps]}
        if self.name:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        raw = data.get("step", data.get("steps"))
        if not isinstance(raw, list) or not raw:
            raise PlanError("a plan needs a non-empty list of steps ([[step]] tables)")
        steps = []
        for index, item in enumerate(raw):
            if not isinstance(item, Mapping) or "op" not in item:
                raise PlanError(f"step {index}: every step needs an 'op'")
            item = dict(item)
            op = item.pop("op")
            meta = {k: item.pop(k) for k in STEP_KEYS if k in item}
            steps.append(_step_from(op, item, meta))
        return cls(tuple(steps), name=str(data.get("name", "")))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    @classmethod
    def from_toml(cls, text: str) -> "Plan":
        return cls.from_dict(tomllib.loads(text))

    def describe(self) -> list[str]:
        return [f"{i}: {s.describe()}" for i, s in enumerate(self.steps)]


# --------------------------------------------------------------------------------------------- validation


def validate(plan: Plan, world: int | None = None) -> Plan:
    """Raise PlanError naming the first step that is malformed; return the plan otherwise."""
    kinds: dict[str, str] = {}  # handle -> what produced it
    for index, st in enumerate(plan.steps):
        try:
            _validate_step(st, kinds, world)
        except PlanError as exc:
            raise PlanError(f"step {index} ({st.op}): {exc}") from None
        if st.out is not None:
            kinds[st.out] = st.spec.produces or ""
    return plan


def _validate_step(st: Step, kinds: dict[str, str], world: int | None) -> None:
    if st.op not in OPS:
        raise PlanError(f"unknown op {st.op!r}; known ops: {', '.join(sorted(OPS))}")
    spec = st.spec
    if not isinstance(st.args, Mapping):
        raise PlanError("fields must be a table")
    unknown = set(st.args) - set(spec.fields)
    if unknown:
        raise PlanError(f"unknown field {sorted(unknown)[0]!r}; {st.op} takes {sorted(spec.fields) or 'no fields'}")
    for name in spec.required:
        if name not in st.args:
            raise PlanError(f"missing field {name!r}")
    if spec.produces and not st.out:
        raise PlanError("needs 'out', the handle it defines")
    if not spec.produces and st.out:
        raise PlanError(f"{st.op} produces nothing, so it takes no 'out'")
    if st.out is not None and not (isinstance(st.out, str) and _HANDLE.match(st.out)):
        raise PlanError(f"handle {st.out!r} must be an identifier")
    _check_rank_list("only_on", st.only_on, world, allow_none=True)
    _check_rank_list("skip_on", st.skip_on, world)
    if not isinstance(st.on_rank, Mapping):
        raise PlanError("on_rank must be a table of rank -> fields")
    for rank, over in st.on_rank.items():
        _check_rank(f"on_rank key {rank!r}", rank, world)
        if not isinstance(over, Mapping):
            raise PlanError(f"on_rank.{rank} must be a table of fields")
        bad = set(over) - set(spec.fields)
        if bad:
            raise PlanError(f"on_rank.{rank} overrides unknown field {sorted(bad)[0]!r}")
    variants = [dict(st.args)] + [st.args_for(r) for r in st.on_rank]
    for args in variants:
        for name, value in args.items():
            _check_field(name, spec.fields[name], value, kinds, world, st.expect_error)
        _check_shape_of_args(st.op, args)


def _check_shape_of_args(op: str, args: Mapping[str, Any]) -> None:
    if op in O.COLLECTIVES and ("mesh" in args) == ("group" in args):
        raise PlanError("needs exactly one of 'mesh' (with 'dim') or 'group'")
    if op in O.COLLECTIVES and "group" in args and "dim" in args:
        raise PlanError("'dim' goes with 'mesh', not with 'group'")
    if op == "from_group" and ("src" in args) == ("group" in args):
        raise PlanError("needs exactly one of 'src' (with 'dims') or 'group'")
    if op == "from_group" and "group" in args and "dims" in args:
        raise PlanError("'dims' goes with 'src', not with 'group'")


def _check_rank(what: str, rank: Any, world: int | None) -> None:
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise PlanError(f"{what} must be a rank number")
    if rank < 0 or (world is not None and rank >= world):
        limit = f"0..{world - 1}" if world is not None else ">= 0"
        raise PlanError(f"{what}: rank {rank} is not in the world ({limit})")


def _check_rank_list(what: str, ranks: Any, world: int | None, allow_none: bool = False) -> None:
    if ranks is None and allow_none:
        return
    if not isinstance(ranks, (list, tuple)):
        raise PlanError(f"{what} must be a list of ranks")
    for rank in ranks:
        _check_rank(what, rank, world)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_field(name: str, kind: str, value: Any, kinds: dict[str, str], world: int | None,
                 expect_error: bool) -> None:
    where = f"field {name!r}"
    if kind == O.SHAPE:
        if not isinstance(value, list) or not value or not all(_is_int(v) and v >= 1 for v in value):
            raise PlanError(f"{where} must be a non-empty list of positive integers, got {value!r}")
        if name == "shape" and world is not None and math.prod(value) > world and not expect_error:
            raise PlanError(f"shape {value} needs {math.prod(value)} ranks but the world has {world}"
                            " (set expect_error = true if that is the point)")
    elif kind == O.INTS:
        if not isinstance(value, list) or not all(_is_int(v) for v in value):
            raise PlanError(f"{where} must be a list of integers")
    elif kind == O.NAMES:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise PlanError(f"{where} must be a list of strings, got {value!r}")
    elif kind == O.NAME_OR_NAMES:
        if not (isinstance(value, str) or (isinstance(value, list) and value
                                           and all(isinstance(v, str) for v in value))):
            raise PlanError(f"{where} must be a name or a non-empty list of names")
    elif kind in (O.NAME, O.TEXT):
        if not isinstance(value, str):
            raise PlanError(f"{where} must be a string")
    elif kind == O.DIM:
        if not (isinstance(value, str) or _is_int(value)):
            raise PlanError(f"{where} must be a dim index or a dim name")
    elif kind == O.DIMS:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) or _is_int(v) for v in value):
            raise PlanError(f"{where} must be a non-empty list of dim indices or names")
    elif kind == O.LAYOUT:
        _check_layout(value, world, expect_error)
    elif kind == O.MESH:
        _check_ref(value, kinds, (O.PRODUCES_MESH, O.PRODUCES_MESH_LIST), where)
    elif kind == O.MESHES:
        if not isinstance(value, list) or not value:
            raise PlanError(f"{where} must be a non-empty list of handles")
        for ref in value:
            _check_ref(ref, kinds, (O.PRODUCES_MESH, O.PRODUCES_MESH_LIST), where)
    elif kind == O.GROUP:
        _check_ref(value, kinds, (O.PRODUCES_GROUP,), where)
    elif kind == O.RANKS:
        _check_rank_list(where, value, world)
        if not value:
            raise PlanError(f"{where} must name at least one rank")
    elif kind == O.SECONDS:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise PlanError(f"{where} must be a non-negative number of seconds")
    elif kind == O.INT:
        if not _is_int(value):
            raise PlanError(f"{where} must be an integer")
    elif kind == O.BOOL:
        if not isinstance(value, bool):
            raise PlanError(f"{where} must be true or false")
    elif kind == O.DEVICE:
        if value not in ("cpu", "cuda"):
            raise PlanError(f"{where} must be 'cpu' or 'cuda'")
    elif kind == O.QUERY:
        if value not in O.QUERIES:
            raise PlanError(f"{where} must be one of {', '.join(O.QUERIES)}")


def _check_ref(ref: Any, kinds: dict[str, str], allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(ref, str):
        raise PlanError(f"{where} must be a handle name")
    match = _REF.match(ref)
    if not match or match.group(1) not in kinds:
        known = ", ".join(sorted(kinds)) or "none yet"
        raise PlanError(f"unknown handle {ref!r} (defined so far: {known})")
    produced = kinds[match.group(1)]
    indexed = match.group(2) is not None
    if indexed and produced != O.PRODUCES_MESH_LIST:
        raise PlanError(f"{ref!r}: only all_submeshes results can be indexed")
    if produced == O.PRODUCES_MESH_LIST and not indexed:
        raise PlanError(f"{ref!r} is a list of meshes: name one as {ref}.0, {ref}.1, ...")
    if produced not in allowed:
        raise PlanError(f"{ref!r} is a {produced or 'value'}, not a {' or '.join(allowed)}")


def _check_layout(value: Any, world: int | None, expect_error: bool) -> None:
    shape = layout_shape(value)
    if not shape:
        raise PlanError(f"layout must be a rectangular nested list of integers, got {value!r}")
    for rank in flatten_layout(value):
        if rank < 0 or (world is not None and rank >= world and not expect_error):
            raise PlanError(f"layout names rank {rank}, which is not in the world (0..{(world or 1) - 1})")


def layout_shape(value: Any) -> tuple[int, ...] | None:
    """The shape of a rectangular nested list of ints, or None when it is ragged or not ints."""
    if _is_int(value):
        return ()
    if not isinstance(value, list) or not value:
        return None
    shapes = {layout_shape(v) for v in value}
    if len(shapes) != 1 or None in shapes:
        return None
    inner = shapes.pop()
    if inner == () and not all(_is_int(v) for v in value):
        return None
    return (len(value),) + inner


def flatten_layout(value: Any) -> list[int]:
    if _is_int(value):
        return [value]
    return [r for v in value for r in flatten_layout(v)]


def restrict_view(view: Any, coordinate: tuple[int, ...], shape: tuple[int, ...],
                  dims: list[int]) -> tuple[list[int], tuple[int, ...]]:
    """A mesh as one rank sees it, kept along `dims` (in that order) and fixed elsewhere at its coordinate.

    This is the layout `from_group` uses by default for several dims: the source mesh seen from this rank.
    """
    out_shape = tuple(shape[i] for i in dims)
    flat = []
    for index in range(math.prod(out_shape)):
        coord = list(coordinate)
        rest = index
        for pos in reversed(range(len(dims))):
            coord[dims[pos]] = rest % out_shape[pos]
            rest //= out_shape[pos]
        cell = view
        for c in coord:
            cell = cell[c]
        flat.append(cell)
    return flat, out_shape


def steps(*items: Step | Iterable[Step]) -> Plan:
    """Plan from steps (convenience for tests and users)."""
    flat: list[Step] = []
    for item in items:
        flat.extend([item] if isinstance(item, Step) else item)
    return Plan(tuple(flat))
