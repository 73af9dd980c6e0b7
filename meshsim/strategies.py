"""Hypothesis strategies for topologies, meshes and plans of mesh operations.

Plans are built step by step while the reference model (rank 0's view; plans here are SPMD) follows
along, so each step can only name handles that exist and shapes that fit. Illegal requests (slices out of
order, repeated or unknown names, flatten name clashes, unflatten sizes that do not multiply, overlapping
concatenations, meshes larger than the world) are drawn on purpose: the model says which error torch must
raise. Every choice is a plain Hypothesis draw, so failures shrink to short plans on few ranks.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from .model.expect import ModelRaise
from .model.mesh import MeshModel
from .model.predict import RankRun, observe_step
from .plan import Plan, Step, step
from .plan.ops import QUERIES
from .topology import Topology

NAME_POOL = ("dp", "tp", "cp", "pp", "ep", "a", "b", "c", "x", "y", "z", "rep", "shard", "w0", "dp_cp", "tp_ep")


def topologies(max_world: int = 16, max_hosts: int = 4, max_devices: int = 8) -> st.SearchStrategy[Topology]:
    return st.builds(Topology, st.integers(1, max_hosts), st.integers(1, max_devices)).filter(
        lambda t: t.world <= max_world)


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def mesh_shapes(draw: Any, world: int, max_dims: int = 5, allow_smaller: bool = True,
                allow_size_one: bool = True) -> list[int]:
    """A shape whose product is the world (mostly) or smaller; every factorisation is reachable."""
    numel = world
    if allow_smaller and draw(st.integers(0, 9)) == 0:
        numel = draw(st.integers(1, world))
    ndim = draw(st.integers(1, max_dims))
    shape = [1] * ndim
    for factor in _prime_factors(numel):
        shape[draw(st.integers(0, ndim - 1))] *= factor
    if not allow_size_one:
        shape = [s for s in shape if s > 1] or [numel]
    return shape


def dim_names(n: int) -> st.SearchStrategy[list[str]]:
    """Distinct identifiers, in any order (not sorted)."""
    pool = st.sampled_from(NAME_POOL) | st.from_regex(r"[a-z][a-z0-9_]{0,4}", fullmatch=True)
    return st.lists(pool, min_size=n, max_size=n, unique=True)


@st.composite
def rank_layouts(draw: Any, world: int, shape: list[int]) -> list:
    """Ranks laid out in `shape`: any permutation, and any subset of the world when shape is smaller."""
    numel = math.prod(shape)
    ranks = draw(st.permutations(range(world)))[:numel]
    if draw(st.booleans()):
        ranks = sorted(ranks) if draw(st.booleans()) else ranks
    return _nest(ranks, shape)


def _nest(flat: list[int], shape: list[int]) -> list:
    if len(shape) == 1:
        return list(flat)
    size = math.prod(shape[1:])
    return [_nest(flat[i * size:(i + 1) * size], shape[1:]) for i in range(shape[0])]


# --------------------------------------------------------------------------------------------- plans


class _Builder:
    """A plan being drawn, with the model following rank 0 to know what each handle holds."""

    def __init__(self, world: int):
        self.world = world
        self.run = RankRun(Plan(()), 0, world)
        self.steps: list[Step] = []
        self.counter = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def add(self, st_: Step) -> None:
        self.run.model.step = len(self.steps)
        try:
            observe_step(self.run, st_, st_.args_for(0), len(self.steps))
        except ModelRaise:
            pass
        self.steps.append(st_)

    def meshes(self) -> list[tuple[str, MeshModel]]:
        out = []
        for name, value in self.run.handles.items():
            if isinstance(value, MeshModel):
                out.append((name, value))
            elif isinstance(value, list):
                out.extend((f"{name}.{i}", m) for i, m in enumerate(value) if isinstance(m, MeshModel))
        return out

    def plan(self) -> Plan:
        return Plan(tuple(self.steps))


@st.composite
def root_steps(draw: Any, world: int, allow_errors: bool = True, numel: int | None = None) -> Step:
    """A step that makes a root mesh: init_device_mesh, or DeviceMesh with an explicit rank layout."""
    shape = draw(mesh_shapes(numel, allow_smaller=False) if numel else mesh_shapes(world))
    if allow_errors and draw(st.integers(0, 19)) == 0:
        shape = shape + [2]  # larger than the world now and then: torch must refuse
    named = draw(st.integers(0, 5)) > 0
    names = draw(dim_names(len(shape))) if named else None
    out = "m"
    if math.prod(shape) <= world and draw(st.integers(0, 3)) == 0:
        return step("mesh", layout=draw(rank_layouts(world, shape)), names=names, out=out)
    return step("init_device_mesh", shape=shape, names=names, out=out,
                expect_error=math.prod(shape) > world or None)


def _names_of(mesh: MeshModel) -> list[str]:
    return list(mesh.names) if mesh.names else []


@st.composite
def _slice_step(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> Step | None:
    names = _names_of(mesh)
    if mesh.root is None and mesh.flatten_mapping:
        names += list(mesh.flatten_mapping)
    if not names:
        return step("slice", src=handle, names="a", out=b.fresh("s")) if allow_errors else None
    picked = [n for n in names if draw(st.booleans())] or [draw(st.sampled_from(names))]
    if allow_errors:
        mode = draw(st.integers(0, 9))
        if mode == 0:
            picked = list(reversed(picked)) if len(picked) > 1 else picked
        elif mode == 1:
            picked = picked + [picked[0]]
        elif mode == 2:
            picked = picked + ["nope"]
    value: Any = picked[0] if len(picked) == 1 and draw(st.booleans()) else picked
    return step("slice", src=handle, names=value, out=b.fresh("s"))


@st.composite
def _flatten_step(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> Step:
    choice = draw(st.integers(0, 5))
    name = None
    if choice in (1, 2):
        name = b.fresh("f")
    elif choice == 3 and allow_errors:
        existing = _names_of(mesh.root_mesh) + list(mesh.root_mesh.flatten_mapping)
        name = draw(st.sampled_from(existing)) if existing else None
    return step("flatten", src=handle, name=name, out=b.fresh("f"))


@st.composite
def _unflatten_step(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> Step | None:
    if not mesh.names:
        return None
    splittable = [i for i, s in enumerate(mesh.shape) if s > 1]
    if not splittable:
        return None
    dim = draw(st.sampled_from(splittable))
    size = mesh.shape[dim]
    parts = draw(st.integers(2, 3))
    sizes = [1] * parts
    for factor in _prime_factors(size):
        sizes[draw(st.integers(0, parts - 1))] *= factor
    if allow_errors and draw(st.integers(0, 9)) == 0:
        sizes[0] += 1  # product no longer matches
    names = [b.fresh("u") for _ in sizes]
    if allow_errors and draw(st.integers(0, 9)) == 0:
        names[0] = draw(st.sampled_from(_names_of(mesh)))
    key: Any = mesh.names[dim] if draw(st.booleans()) else dim
    return step("unflatten", src=handle, dim=key, sizes=sizes, names=names, out=b.fresh("u"))


@st.composite
def _concatenate_step(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> Step | None:
    others = [(h, m) for h, m in b.meshes() if m.names and (allow_errors or m.root_mesh is mesh.root_mesh)]
    if not mesh.names or not others:
        return None
    partner = draw(st.sampled_from(others))[0]
    srcs = [handle, partner] if draw(st.booleans()) else [partner, handle]
    return step("concatenate", srcs=srcs, out=b.fresh("c"))


@st.composite
def _from_group_step(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> Step:
    dims = [i for i in range(mesh.ndim) if draw(st.booleans())] or [draw(st.integers(0, mesh.ndim - 1))]
    keys: list[Any] = [mesh.names[i] if mesh.names and draw(st.booleans()) else i for i in dims]
    return step("from_group", src=handle, dims=keys, out=b.fresh("g"))


@st.composite
def _submeshes_step(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> Step | None:
    names = _names_of(mesh)
    if not names:
        return None
    dim = draw(st.sampled_from(names + (["nope"] if allow_errors else [])))
    return step("all_submeshes", src=handle, dim=dim, out=b.fresh("l"))


@st.composite
def _query_step(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> Step:
    what = draw(st.sampled_from(QUERIES))
    dim: Any = None
    if what in ("get_group", "get_local_rank", "size") and (mesh.ndim > 1 or draw(st.booleans())):
        choices: list[Any] = list(range(mesh.ndim)) + _names_of(mesh)
        if allow_errors:
            choices += [mesh.ndim, "nope"]
        dim = draw(st.sampled_from(choices))
    return step("query", mesh=handle, what=what, dim=dim)


_DERIVE = (_slice_step, _slice_step, _flatten_step, _unflatten_step, _concatenate_step, _from_group_step,
           _submeshes_step, _query_step)


@st.composite
def plans(draw: Any, world: int, max_steps: int = 6, allow_errors: bool = True,
          check_every_mesh: bool = False, root_numel: int | None = None) -> Plan:
    """SPMD plans: a root mesh, then derived meshes, queries and checks that use earlier results."""
    b = _Builder(world)
    b.add(draw(root_steps(world, allow_errors, numel=root_numel)))
    for _ in range(draw(st.integers(0, max_steps - 1))):
        meshes = b.meshes()
        if not meshes:
            break
        handle, mesh = draw(st.sampled_from(meshes))
        if draw(st.integers(0, 3)) == 0:
            b.add(step("check", mesh=handle))
            continue
        derive = draw(st.sampled_from(_DERIVE))
        made = draw(derive(b, handle, mesh, allow_errors))
        if made is not None:
            b.add(made)
            if check_every_mesh and made.out and made.out in b.run.handles:
                b.add(step("check", mesh=made.out))
    checked = {s.args.get("mesh") for s in b.steps if s.op == "check"}
    unchecked = [h for h, _ in b.meshes() if h not in checked]
    if unchecked:
        b.add(step("check", mesh=unchecked[-1]))
    return b.plan()


@st.composite
def topology_plans(draw: Any, topologies: list[Topology] | None = None, max_steps: int = 6,
                   allow_errors: bool = True) -> tuple[Topology, Plan]:
    """A topology and a plan for its world, shrinking toward small worlds.

    The root mesh's size is drawn first and the topology follows it (the smallest that holds it, or a larger
    one drawn on top): when a failing root mesh shrinks, the world shrinks with it, and the rest of the plan
    keeps its meaning.
    """
    choices = sorted(topologies or [Topology(1, 2), Topology(2, 2), Topology(2, 4), Topology(4, 4)],
                     key=lambda t: (t.world, t.hosts))
    sizes = sorted({t.world for t in choices})
    numel = draw(st.sampled_from(sizes))
    fitting = [t for t in choices if t.world >= numel]
    topology = fitting[draw(st.integers(0, len(fitting) - 1))]
    return topology, draw(plans(topology.world, max_steps=max_steps, allow_errors=allow_errors, root_numel=numel))


@st.composite
def divergent_plans(draw: Any, world: int) -> Plan:
    """Plans where ranks disagree: a collective skipped, a shape that differs, a rank that raises or dies.

    The model predicts whether each one hangs, errors or crashes, so these check the harness's deadline and
    diagnosis as much as torch.
    """
    shape = draw(mesh_shapes(world, max_dims=3, allow_smaller=False, allow_size_one=False))
    names = [f"d{i}" for i in range(len(shape))]
    steps_: list[Step] = [step("init_device_mesh", shape=shape, names=names, out="m")]
    rank = draw(st.integers(0, world - 1))
    dim = draw(st.sampled_from(names))
    kind = draw(st.sampled_from(["skip", "shape", "raise", "exit", "order"]))
    if kind == "skip":
        steps_.append(step("all_reduce", mesh="m", dim=dim, skip_on=[rank]))
    elif kind == "shape" and len(shape) > 1:
        steps_.append(step("init_device_mesh", shape=list(reversed(shape)), names=names, out="n",
                           on_rank={rank: {"shape": [math.prod(shape)], "names": ["flat"]}}))
    elif kind == "raise":
        steps_.append(step("raise", message="injected", only_on=[rank]))
    elif kind == "exit":
        steps_.append(step("exit", code=7, only_on=[rank]))
    else:
        other = draw(st.sampled_from(names))
        steps_ += [step("all_reduce", mesh="m", dim=dim, skip_on=[rank]),
                   step("all_reduce", mesh="m", dim=other),
                   step("all_reduce", mesh="m", dim=dim, only_on=[rank])]
    steps_.append(step("check", mesh="m"))
    return Plan(tuple(steps_))
