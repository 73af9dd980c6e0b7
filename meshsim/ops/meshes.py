"""Operations that make meshes and groups: roots, derived meshes, new_group."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from ..spec import fields as F
from ..spec.fields import PlanError, flatten_layout, layout_shape
from ..spec.plan import restrict_view, step
from .registry import holds, operation, rarely

# ------------------------------------------------------------------------------------------ drawing helpers

NAME_POOL = ("dp", "tp", "cp", "pp", "ep", "a", "b", "c", "x", "y", "z", "rep", "shard", "w0", "dp_cp", "tp_ep")


def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def mesh_shapes(draw: Any, world: int, max_dims: int = 5, allow_smaller: bool = True,
                allow_size_one: bool = True, smaller_one_in: int = 10) -> list[int]:
    """A shape whose product is the world (mostly) or smaller; every factorisation is reachable."""
    numel = world
    if allow_smaller and draw(st.integers(0, smaller_one_in - 1)) == 0:
        numel = draw(st.integers(1, world))
    ndim = draw(st.integers(1, max_dims))
    shape = [1] * ndim
    for factor in prime_factors(numel):
        shape[draw(st.integers(0, ndim - 1))] *= factor
    if not allow_size_one:
        shape = [s for s in shape if s > 1] or [numel]
    return shape


def dim_names(n: int) -> st.SearchStrategy[list[str]]:
    """Distinct identifiers, in any order (not sorted)."""
    pool = st.sampled_from(NAME_POOL) | st.from_regex(r"[a-z][a-z0-9_]{0,4}", fullmatch=True)
    return st.lists(pool, min_size=n, max_size=n, unique=True)


def nest(flat: list[int], shape: list[int]) -> list:
    if len(shape) == 1:
        return list(flat)
    size = math.prod(shape[1:])
    return [nest(flat[i * size:(i + 1) * size], shape[1:]) for i in range(shape[0])]


PERMUTE_EVERY_RANK_TO = 256  # larger worlds draw a permutation in a few moves (a draw per rank would not fit)


@st.composite
def large_permutations(draw: Any, world: int) -> list[int]:
    """A permutation of range(world) made of a few drawn moves (reversed, rotated, two blocks swapped, some ranks
    swapped): non-monotonic layouts of any size for a handful of draws, where a draw per rank would overrun."""
    ranks = list(range(world))
    if draw(st.booleans()):
        ranks.reverse()
    shift = draw(st.integers(0, world - 1))
    ranks = ranks[shift:] + ranks[:shift]
    if draw(st.booleans()):
        size = draw(st.integers(1, world // 2))
        a, b = sorted(draw(st.lists(st.integers(0, world // size - 1), min_size=2, max_size=2, unique=True)))
        ranks[a * size:(a + 1) * size], ranks[b * size:(b + 1) * size] = (ranks[b * size:(b + 1) * size],
                                                                           ranks[a * size:(a + 1) * size])
    for _ in range(draw(st.integers(0, 3))):
        i, j = draw(st.integers(0, world - 1)), draw(st.integers(0, world - 1))
        ranks[i], ranks[j] = ranks[j], ranks[i]
    return ranks


@st.composite
def rank_layouts(draw: Any, world: int, shape: list[int]) -> list:
    """Ranks laid out in `shape`: any permutation, and any subset of the world when shape is smaller."""
    every = st.permutations(range(world)) if world <= PERMUTE_EVERY_RANK_TO else large_permutations(world)
    ranks = draw(every)[:math.prod(shape)]
    if draw(st.booleans()):
        ranks = sorted(ranks) if draw(st.booleans()) else ranks
    return nest(ranks, shape)


def names_of(mesh: Any) -> list[str]:
    return list(mesh.names) if mesh.names else []


def well_named(mesh: Any) -> bool:
    """One name per dim (torch lets some meshes through with names of another length)."""
    return bool(mesh.names) and len(mesh.names) == mesh.ndim


def _tuple(names: Any) -> tuple | None:
    return tuple(names) if names is not None else None


def _overrides(a: dict) -> dict | None:
    pairs = a.get("backend_override")
    return {key: backend for key, backend in pairs} if pairs is not None else None


@st.composite
def draw_overrides(draw: Any, ndim: int, names: Any, allow_errors: bool) -> Any:
    """Now and then a backend_override: by index or by name, and (errors) both, or a key that is neither."""
    if not rarely(draw, 6):
        return None
    keys: list[Any] = list(range(ndim)) + list(names or [])
    if allow_errors:
        keys += [ndim + 1, "nope"]
    return [[key, "gloo"] for key in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=2))]


# ------------------------------------------------------------------------------------------ roots

@operation("init_device_mesh", "root", {"shape": F.SHAPE, "names": F.NAMES, "device": F.DEVICE,
                                        "backend_override": F.OVERRIDES}, ("shape",), F.PRODUCES_MESH,
           creates_groups=True)
class InitDeviceMesh:
    """init_device_mesh(device, shape, mesh_dim_names=names, backend_override=...); device defaults to the
    backend's"""

    def model(run: Any, a: dict) -> Any:
        return run.model.init_device_mesh(list(a["shape"]), a.get("names"), a.get("device"),
                                          a.get("backend_override"))

    def torch(ex: Any, a: dict) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(a.get("device", ex.device_type), tuple(a["shape"]),
                                mesh_dim_names=_tuple(a.get("names")), backend_override=_overrides(a))

    @st.composite
    def draw(draw: Any, b: Any, handle: Any, mesh: Any, allow_errors: bool, numel: int | None = None) -> Any:
        shape = draw(mesh_shapes(numel, allow_smaller=False) if numel else mesh_shapes(b.world))
        if allow_errors and rarely(draw, 20):
            shape = shape + [2]  # larger than the world now and then: torch must refuse
        names = draw(dim_names(len(shape))) if draw(st.integers(0, 5)) > 0 else None
        if allow_errors and names and rarely(draw, 15):
            names = draw(st.sampled_from([names + [names[0]], names[:-1] or ["x", "y"], [names[0]] * len(names)]))
        devices = [None, None, None, b.device, f"{b.device}:0"] if allow_errors else [None, b.device]
        device = draw(st.sampled_from(devices))
        return step("init_device_mesh", shape=shape, names=names, device=device, out=b.fresh("m"),
                    backend_override=draw(draw_overrides(len(shape), names, allow_errors)),
                    expect_error=math.prod(shape) > b.world or None)


@operation("mesh", "root", {"layout": F.LAYOUT, "names": F.NAMES, "device": F.DEVICE, "init_backend": F.BOOL,
                            "as_rank": F.GROUP_RANK, "preserve_rank_order": F.BOOL}, ("layout",), F.PRODUCES_MESH,
           creates_groups=True)
class ExplicitMesh:
    """DeviceMesh(device, layout, mesh_dim_names=names, _init_backend=init_backend, _rank=as_rank,
    preserve_rank_order=...): explicit ranks, any order, any subset (beyond the world too, when init_backend is
    false); preserve_rank_order (torch >= 2.15) keeps each dim's group in mesh order"""

    def model(run: Any, a: dict) -> Any:
        from ..model.layout import interned

        flat = interned(tuple(flatten_layout(a["layout"])))
        return run.model.explicit(flat, layout_shape(a["layout"]) or (), a.get("names"), a.get("init_backend", True),
                                  a.get("device"), a.get("as_rank"), bool(a.get("preserve_rank_order")))

    def torch(ex: Any, a: dict) -> Any:
        from torch.distributed.device_mesh import DeviceMesh

        # keywords a release may lack are passed only when the plan gives them (needs_of says which release)
        given = {"_rank": a.get("as_rank"), "preserve_rank_order": a.get("preserve_rank_order")}
        return DeviceMesh(a.get("device", ex.device_type), a["layout"], mesh_dim_names=_tuple(a.get("names")),
                          _init_backend=a.get("init_backend", True),
                          **{name: value for name, value in given.items() if value is not None})

    def needs_of(a: Any) -> str | None:
        if a.get("preserve_rank_order") is not None:
            return "preserve-rank-order"
        return "mesh-rank-keyword" if a.get("as_rank") is not None else None

    @st.composite
    def draw(draw: Any, b: Any, handle: Any, mesh: Any, allow_errors: bool, numel: int | None = None) -> Any:
        shape = draw(mesh_shapes(numel, allow_smaller=False) if numel else mesh_shapes(b.world, smaller_one_in=3))
        names = draw(dim_names(len(shape))) if draw(st.integers(0, 5)) > 0 else None
        layout = draw(rank_layouts(b.world, shape))
        if allow_errors and math.prod(shape) > 1 and rarely(draw, 60):
            flat = flatten_layout(layout)
            layout = nest([flat[1]] + flat[1:], shape)  # a rank named twice: torch does not refuse it
        if rarely(draw, 10):  # a mesh that never builds groups, seen as another rank
            return step("mesh", layout=layout, names=names, init_backend=False,
                        as_rank=draw(st.integers(0, b.world - 1)), out=b.fresh("m"))
        device = draw(st.sampled_from([None, None, b.device, f"{b.device}:0"]))
        preserve = draw(st.sampled_from([None, None, True, False])) if holds("preserve-rank-order", b.platform) \
            else None
        return step("mesh", layout=layout, names=names, device=device, preserve_rank_order=preserve,
                    out=b.fresh("m"))


# ------------------------------------------------------------------------------------------ derived meshes

@operation("slice", "derive", {"src": F.MESH, "names": F.NAME_OR_NAMES, "as_list": F.BOOL,
                                "fake_tensor_mode": F.BOOL}, ("src", "names"), F.PRODUCES_MESH, weight=3)
class Slice:
    """src[names] (as_list: src[[names...]], the list form; fake_tensor_mode: sliced inside FakeTensorMode, as
    torch.compile traces it)"""

    def model(run: Any, a: dict) -> Any:
        return run.model.slice(run.mesh(a["src"]), a["names"], a.get("as_list", False))

    def torch(ex: Any, a: dict) -> Any:
        names = a["names"]
        key = names if isinstance(names, str) else list(names) if a.get("as_list") else tuple(names)
        if not a.get("fake_tensor_mode"):
            return ex.mesh(a["src"])[key]
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            return ex.mesh(a["src"])[key]

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        names = names_of(mesh)
        if mesh.root is None and mesh.flatten_mapping:
            names += list(mesh.flatten_mapping)
        if not names:
            return step("slice", src=handle, names="a", out=b.fresh("s")) if allow_errors else None
        picked = [n for n in names if draw(st.booleans())] or [draw(st.sampled_from(names))]
        if allow_errors:
            mode = draw(st.integers(0, 9))  # 7-9: a request torch must refuse (shrinking leaves them for 0)
            if mode == 7:
                picked = list(reversed(picked)) if len(picked) > 1 else picked
            elif mode == 8:
                picked = picked + [picked[0]]
            elif mode == 9:
                picked = picked + ["nope"]
        value: Any = picked[0] if len(picked) == 1 and draw(st.booleans()) else picked
        as_list = True if not isinstance(value, str) and rarely(draw, 5) else None
        fake = True if rarely(draw, 8) else None
        return step("slice", src=handle, names=value, as_list=as_list, fake_tensor_mode=fake, out=b.fresh("s"))


@operation("flatten", "derive", {"src": F.MESH, "name": F.NAME, "backend": F.TEXT}, ("src",), F.PRODUCES_MESH,
           creates_groups=True, weight=2)
class Flatten:
    """src._flatten(name, backend_override=backend)"""

    @staticmethod
    def check_args(a: dict) -> None:
        if "backend" in a and a["backend"] not in F.BACKENDS:
            raise PlanError(f"backend must be one of {', '.join(F.BACKENDS)}, got {a['backend']!r}")

    def model(run: Any, a: dict) -> Any:
        return run.model.flatten(run.mesh(a["src"]), a.get("name"), "backend" in a)

    def torch(ex: Any, a: dict) -> Any:
        return ex.mesh(a["src"])._flatten(a.get("name"), backend_override=a.get("backend"))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        choice = draw(st.integers(0, 5))
        name = None
        if choice in (1, 2):
            name = b.fresh("f")
        elif choice == 3 and allow_errors:
            existing = names_of(mesh.root_mesh) + list(mesh.root_mesh.flatten_mapping)
            name = draw(st.sampled_from(existing)) if existing else None
        backend = "gloo" if rarely(draw, 6) else None
        return step("flatten", src=handle, name=name, backend=backend, out=b.fresh("f"))


@operation("unflatten", "derive", {"src": F.MESH, "dim": F.DIM, "sizes": F.SHAPE, "names": F.NAMES,
                                   "backend_override": F.OVERRIDES}, ("src", "dim", "sizes", "names"),
           F.PRODUCES_MESH, creates_groups=True, weight=2, needs="mesh-layout")
class Unflatten:
    """src._unflatten(dim, sizes, names, backend_override=...)"""

    def model(run: Any, a: dict) -> Any:
        return run.model.unflatten(run.mesh(a["src"]), a["dim"], list(a["sizes"]), list(a["names"]),
                                   a.get("backend_override"))

    def torch(ex: Any, a: dict) -> Any:
        return ex.mesh(a["src"])._unflatten(a["dim"], tuple(a["sizes"]), tuple(a["names"]),
                                            backend_override=_overrides(a))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        if not well_named(mesh):
            return None
        splittable = [i for i, s in enumerate(mesh.shape) if s > 1]
        if not splittable:
            return None
        dim = draw(st.sampled_from(splittable))
        parts = draw(st.integers(2, 3))
        sizes = [1] * parts
        for factor in prime_factors(mesh.shape[dim]):
            sizes[draw(st.integers(0, parts - 1))] *= factor
        if allow_errors and rarely(draw, 10):
            sizes[0] += 1  # product no longer matches
        names = [b.fresh("u") for _ in sizes]
        if allow_errors and rarely(draw, 10):
            names[0] = draw(st.sampled_from(names_of(mesh)))
        key: Any = draw(st.sampled_from([mesh.names[dim], dim, dim - mesh.ndim]))
        if allow_errors and rarely(draw, 10):
            key = draw(st.sampled_from([mesh.ndim, "nope"]))
        if allow_errors and rarely(draw, 15):
            names = names[:-1]
        return step("unflatten", src=handle, dim=key, sizes=sizes, names=names, out=b.fresh("u"),
                    backend_override=draw(draw_overrides(len(sizes), names, allow_errors)))


@operation("concatenate", "derive", {"srcs": F.MESHES}, ("srcs",), F.PRODUCES_MESH, weight=2, needs="mesh-layout")
class Concatenate:
    """DeviceMesh._concatenate([srcs...])"""

    def model(run: Any, a: dict) -> Any:
        return run.model.concatenate([run.mesh(ref) for ref in a["srcs"]])

    def torch(ex: Any, a: dict) -> Any:
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh._concatenate([ex.mesh(ref) for ref in a["srcs"]])

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        others = [(h, m) for h, m in b.meshes() if m.names and (allow_errors or m.root_mesh is mesh.root_mesh)]
        if not mesh.names or not others:
            return None
        partner = draw(st.sampled_from(others))[0]
        srcs = [handle, partner] if draw(st.booleans()) else [partner, handle]
        return step("concatenate", srcs=srcs, out=b.fresh("c"))


@operation("from_group", "derive", {"src": F.MESH, "dims": F.DIMS, "group": F.GROUP, "groups": F.GROUP_CHOICES,
                                    "layout": F.LAYOUT, "layout_tensor": F.BOOL, "names": F.NAMES, "device": F.DEVICE},
           (), F.PRODUCES_MESH, weight=2)
class FromGroup:
    """DeviceMesh.from_group(groups of src's dims, or a new_group handle, or one handle per dim out of lists of
    new_group handles; mesh=layout (a tensor where layout_tensor, a list else), else src seen from this rank)"""

    @staticmethod
    def check_args(a: dict) -> None:
        if sum(key in a for key in ("src", "group", "groups")) != 1:
            raise PlanError("needs exactly one of 'src' (with 'dims'), 'group' or 'groups'")
        if "dims" in a and "src" not in a:
            raise PlanError("'dims' goes with 'src'")

    def model(run: Any, a: dict) -> Any:
        from ..model.expect import Err, ModelRaise
        from ..model.layout import interned

        model = run.model
        layout = a.get("layout")
        flat = interned(tuple(flatten_layout(layout))) if layout is not None else None
        shape = layout_shape(layout) if layout is not None else None
        device = a.get("device")
        if "group" in a or "groups" in a:
            groups = [run.resolve(a["group"])] if "group" in a else [
                _member_of(choices, run.resolve) for choices in a["groups"]]
            if "group" in a and groups[0] is None:
                raise ModelRaise(Err("TypeError", "not iterable"))
            return model.from_groups(groups, flat, shape, a.get("names"), "group" in a, device)
        src = run.mesh(a["src"])
        dims = a.get("dims") or list(range(src.ndim))
        groups = [model.get_group(src, d) for d in dims]
        names = _default_names(a.get("names"), src.names, dims, src.ndim)
        if len(dims) > 1 and flat is None:
            seen, shape = _seen_from_here(src, dims, lambda keys: model.mesh_view(model.slice(src, keys)),
                                          model.mesh_view, src.coordinate, src.shape, src.names)
            flat = tuple(seen)
        return model.from_groups(groups, flat, shape, names, len(dims) == 1, device or src.device)

    def torch(ex: Any, a: dict) -> Any:
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        layout = a.get("layout")
        if layout is not None and a.get("layout_tensor"):  # torch takes both, and checks each its own way
            layout = torch.tensor(layout, dtype=torch.int)
        if "group" in a or "groups" in a:
            group = ex.resolve(a["group"]) if "group" in a else [
                _member_of(choices, ex.resolve) for choices in a["groups"]]
            names = a.get("names")
            return DeviceMesh.from_group(group, a.get("device", ex.device_type), mesh=layout,
                                         mesh_dim_names=_tuple(names) if names else None)
        src = ex.mesh(a["src"])
        dims = a.get("dims") or list(range(src.ndim))
        groups = [src.get_group(d) for d in dims]
        names = _default_names(a.get("names"), src.mesh_dim_names, dims, src.ndim)
        device = a.get("device", src.device_type)
        if len(dims) == 1:
            return DeviceMesh.from_group(groups[0], device, mesh=layout,
                                         mesh_dim_names=_tuple(names) if names else None)
        if layout is None:
            coordinate = src.get_coordinate()
            flat, shape = _seen_from_here(src, dims, lambda keys: src[keys].mesh.tolist(),
                                          lambda m: m.mesh.tolist(), tuple(coordinate) if coordinate else None,
                                          tuple(src.shape), src.mesh_dim_names, ex.HandleError)
            layout = torch.tensor(flat, dtype=torch.int).reshape(shape)
        return DeviceMesh.from_group(groups, device, mesh=layout, mesh_dim_names=_tuple(names) if names else None)

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        dims = [i for i in range(mesh.ndim) if draw(st.booleans())] or [draw(st.integers(0, mesh.ndim - 1))]
        keys: list[Any] = [mesh.names[i] if well_named(mesh) and draw(st.booleans()) else i for i in dims]
        flattened = list(mesh.root_mesh.flatten_mapping) if mesh.root is None else []
        if flattened and rarely(draw, 4):
            keys = [draw(st.sampled_from(flattened))] + [k for k in keys if isinstance(k, str)]
        extra: dict[str, Any] = {}
        if allow_errors and mesh.coordinate is not None and rarely(draw, 6):
            # 1-D: usually not the group's ranks; several dims: a flat list, not one dim per group. Both refused.
            extra["layout"] = draw(rank_layouts(b.world, [mesh.shape[dims[0]] if len(keys) == 1 else 1]))
        if rarely(draw, 6):
            count = len(keys) + (draw(st.sampled_from([-1, 1])) if allow_errors else 0)
            extra["names"] = [b.fresh("n") for _ in range(max(1, count))]
        return step("from_group", src=handle, dims=keys, out=b.fresh("g"), **extra)


def _member_of(choices: list[str], resolve: Any) -> Any:
    """The first of the handles whose group this rank is in (None: it is in none)."""
    for ref in choices:
        value = resolve(ref)
        if value is not None:
            return value
    return None


def _default_names(names: Any, src_names: Any, dims: list, ndim: int) -> Any:
    """The names from_group passes when the plan gives none: src's names of those dims (none when src's names
    are not one per dim)."""
    if names is None and src_names and len(src_names) == ndim:
        return [src_names[d] if isinstance(d, int) else d for d in dims]
    return names


def _seen_from_here(src: Any, dims: list, sliced_view: Any, view: Any, coordinate: Any, shape: tuple,
                    names: Any, not_here: Any = None) -> tuple[list[int], tuple[int, ...]]:
    """The default `mesh=` for from_group over several dims of src: src seen from this rank along those dims
    (a slice's view when a dim is a flattened name that src itself lacks)."""
    from ..model.expect import Err, ModelRaise

    if names and any(isinstance(d, str) and d not in names for d in dims):
        keys = tuple(names[d] if isinstance(d, int) else d for d in dims)
        nested = sliced_view(keys)
        return flatten_layout(nested), tuple(layout_shape(nested) or ())
    if coordinate is None:
        if not_here is not None:
            raise not_here("this rank is not in the source mesh")
        raise ModelRaise(Err("HandleError", "this rank is not in the source mesh"))
    indices = [names.index(d) if isinstance(d, str) else d for d in dims]
    return restrict_view(view(src), coordinate, shape, indices)


@operation("all_submeshes", "derive", {"src": F.MESH, "dim": F.NAME}, ("src", "dim"), F.PRODUCES_MESH_LIST, weight=1,
           needs="mesh-layout")
class AllSubmeshes:
    """src._get_all_submeshes(dim): handles out.0, out.1, ..."""

    def model(run: Any, a: dict) -> Any:
        return run.model.all_submeshes(run.mesh(a["src"]), a["dim"])

    def torch(ex: Any, a: dict) -> Any:
        return ex.mesh(a["src"])._get_all_submeshes(a["dim"])

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        names = names_of(mesh)
        if not names:
            return None
        dim = draw(st.sampled_from(names + (["nope"] if allow_errors else [])))
        return step("all_submeshes", src=handle, dim=dim, out=b.fresh("l"))


@operation("new_group", "group", {"ranks": F.RANKS}, ("ranks",), F.PRODUCES_GROUP, creates_groups=True, weight=1)
class NewGroup:
    """dist.new_group(ranks)"""

    def model(run: Any, a: dict) -> Any:
        return run.model.new_group(list(a["ranks"]))

    def torch(ex: Any, a: dict) -> Any:
        import torch.distributed as dist

        group = dist.new_group(list(a["ranks"]))
        return group if isinstance(group, dist.ProcessGroup) else None  # non-members get a sentinel int

    @st.composite
    def draw(draw: Any, b: Any, handle: Any, mesh: Any, allow_errors: bool) -> Any:
        ranks = draw(st.lists(st.integers(0, b.world - 1), min_size=1, max_size=b.world, unique=True))
        return step("new_group", ranks=ranks, out=b.fresh("pg"))
