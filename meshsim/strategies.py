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

from hypothesis import event
from hypothesis import strategies as st

from .model import dtensor as D
from .model.mesh import MeshModel
from .ops import OPERATIONS, of_role, rarely
from .ops.dtensor import redistribute_targets, usable
from .ops.meshes import dim_names, mesh_shapes, rank_layouts, well_named  # noqa: F401 -- part of this module's API
from .predict import RankRun, observe_step
from .spec.plan import Plan, Step, step
from .spec.topology import Topology


def topologies(max_world: int = 16, max_hosts: int = 4, max_devices: int = 8) -> st.SearchStrategy[Topology]:
    return st.builds(Topology, st.integers(1, max_hosts), st.integers(1, max_devices)).filter(
        lambda t: t.world <= max_world)


# --------------------------------------------------------------------------------------------- plans


class _Builder:
    """A plan being drawn, with the model following rank 0 to know what each handle holds. `device`: the device
    type the cluster's backend serves, the one an explicit `device=` names (cpu on gloo, cuda on NCCL)."""

    def __init__(self, world: int, device: str = "cpu"):
        self.world = world
        self.device = device
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
        except Exception:  # noqa: BLE001 -- a model that fails here is judged when the plan runs
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
def root_steps(draw: Any, world: int, allow_errors: bool = True, numel: int | None = None,
               builder: _Builder | None = None) -> Step:
    """A step that makes a root mesh: init_device_mesh, or DeviceMesh with an explicit rank layout (named by
    `builder`, so that a plan's roots never share a handle)."""
    b = builder or _Builder(world)
    root = draw(st.sampled_from(of_role("root")))
    return draw(root.draw(b, None, None, allow_errors, numel=numel))


# What plans() draws: every operation by its own weight (meshsim.ops), and three moves of its own: "root" adds
# another independent mesh, "composition" and "dtensor" a deep chain of steps (COMPOSITIONS,
# DTENSOR_COMPOSITIONS) that a random walk rarely completes.
WEIGHTS = {**{op.name: op.weight for op in OPERATIONS.values() if op.weight}, "root": 1, "composition": 5,
           "dtensor": 5}


@st.composite
def plans(draw: Any, world: int, max_steps: int = 6, allow_errors: bool = True,
          check_every_mesh: bool = False, root_numel: int | None = None, device: str = "cpu") -> Plan:
    """SPMD plans: a root mesh, then more roots, derived meshes, deep compositions, queries, collectives and
    checks that use earlier results.

    Each plan enables a random subset of the operations (swarm testing), so rare combinations get room.
    """
    b = _Builder(world, device)
    b.add(draw(root_steps(world, allow_errors, numel=root_numel, builder=b)))
    names = sorted(WEIGHTS)
    enabled = draw(st.sets(st.sampled_from(names), min_size=1)) if draw(st.booleans()) else set(names)
    menu = [n for n in names if n in enabled for _ in range(WEIGHTS[n])]
    for _ in range(draw(st.integers(0, max_steps - 1))):
        meshes = b.meshes()
        if not meshes:
            break
        handle, mesh = draw(st.sampled_from(meshes))
        choice = draw(st.sampled_from(menu))
        event(f"drew {choice}")  # pytest --hypothesis-show-statistics: how often each kind of step is drawn
        if choice in ("composition", "dtensor"):
            draw((compositions if choice == "composition" else dtensor_compositions)(b, handle, mesh, allow_errors))
            continue
        made = draw(root_steps(world, allow_errors, builder=b) if choice == "root" else
                    OPERATIONS[choice].draw(b, handle, mesh, allow_errors))
        if made is not None:
            b.add(made)
            if check_every_mesh and made.out and made.out in b.run.handles:
                b.add(step("check", mesh=made.out))
    checked = {s.args.get("mesh") for s in b.steps if s.op == "check"}
    unchecked = [h for h, _ in b.meshes() if h not in checked]
    if unchecked:
        b.add(step("check", mesh=unchecked[-1]))
    return b.plan()


# --------------------------------------------------------------------------------------------- compositions
# Chains a random walk rarely completes: each adds its steps to the plan being built, with the model following.


@st.composite
def _flatten_family(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    """Several _flattens of different dims of one mesh, then each flattened name looked up from the root,
    from a submesh and from the flattened meshes."""
    names = mesh.names
    if names is None or not well_named(mesh) or mesh.ndim < 2:
        return
    made = []
    for _ in range(draw(st.integers(2, 3))):
        dims = sorted(draw(st.sets(st.integers(0, mesh.ndim - 1), min_size=1, max_size=mesh.ndim)))
        src = handle
        if len(dims) < mesh.ndim:
            src = b.fresh("s")
            b.add(step("slice", src=handle, names=[names[d] for d in dims], out=src))
        flat, out = b.fresh("fn"), b.fresh("f")
        made.append((flat, out))
        b.add(step("flatten", src=src, name=flat, out=out))
    again = draw(st.sampled_from([handle, src]))
    b.add(step("flatten", src=again, name=made[0][0], out=b.fresh("f")))  # the cached mesh, or refused
    root = b.fresh("r")
    b.add(step("root_mesh", src=handle, out=root))
    for flat, _ in made:
        where = draw(st.sampled_from([root, handle, made[0][1]]))
        if draw(st.booleans()):
            b.add(step("slice", src=where, names=flat, out=b.fresh("s")))
        else:
            b.add(step("query", mesh=where, what=draw(st.sampled_from(["get_group", "get_local_rank"])), dim=flat))
    b.add(step("check", mesh=root))


@st.composite
def _concatenate_both_ways(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    """Slices of two disjoint dims, concatenated in both orders (one of them out of order)."""
    names = mesh.names
    if names is None or not well_named(mesh) or mesh.ndim < 2:
        return
    first, second = sorted(draw(st.lists(st.integers(0, mesh.ndim - 1), min_size=2, max_size=2, unique=True)))
    parts = []
    for d in (first, second):
        parts.append(b.fresh("s"))
        b.add(step("slice", src=handle, names=names[d], out=parts[-1]))
    for order in (parts, parts[::-1]):
        out = b.fresh("c")
        b.add(step("concatenate", srcs=list(order), out=out))
        b.add(step("check", mesh=out))


@st.composite
def _unflatten_a_flattened_dim(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    """_flatten some dims, then _unflatten the flattened mesh into other factors."""
    if not mesh.names:
        return
    flat = b.fresh("f")
    b.add(step("flatten", src=handle, name=b.fresh("fn"), out=flat))
    value = b.run.handles.get(flat)
    if isinstance(value, MeshModel):
        made = draw(OPERATIONS["unflatten"].draw(b, flat, value, allow_errors))
        if made is not None:
            b.add(made)
            if made.out in b.run.handles:
                b.add(step("check", mesh=made.out))


@st.composite
def _submesh_of_submesh(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    """A slice of a slice (and its submeshes), down to one dim."""
    for _ in range(3):
        if not mesh.names:
            return
        made = draw(OPERATIONS["slice"].draw(b, handle, mesh, False))
        b.add(made)
        value = b.run.handles.get(made.out)
        if not isinstance(value, MeshModel):
            return
        handle, mesh = made.out, value
    if mesh.names:
        b.add(step("all_submeshes", src=handle, dim=mesh.names[0], out=b.fresh("l")))
    b.add(step("check", mesh=handle))


HAND_MADE_GROUPS = 64


@st.composite
def _from_hand_made_groups(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    """new_group for every group along some dims of a mesh, then DeviceMesh.from_group over those handles."""
    from .model import layout as L

    if mesh.root is not None or isinstance(mesh.view, Exception) or not mesh.ndim or mesh.coordinate is None:
        return
    dims = sorted(draw(st.sets(st.integers(0, mesh.ndim - 1), min_size=1, max_size=mesh.ndim)))
    if sum(b.world // mesh.shape[d] for d in dims) > HAND_MADE_GROUPS:
        return  # a new_group step for each of thousands of groups: a plan too long to mean anything more
    choices = []
    for d in dims:
        handles = []
        for ranks in L.shared_dim_groups(mesh.layout[d], mesh.rank_map):
            handles.append(b.fresh("pg"))
            b.add(step("new_group", ranks=list(ranks), out=handles[-1]))
        choices.append(draw(st.permutations(handles)))
    names = [b.fresh("n") for _ in dims]
    layout = mesh.view if len(dims) == mesh.ndim else None
    if len(dims) == 1 and mesh.ndim == 1:
        layout = mesh.view if draw(st.booleans()) else None
    out = b.fresh("g")
    if layout is None and len(dims) > 1:
        return
    if allow_errors and rarely(draw, 12):
        choices = []  # no group at all: refused
    b.add(step("from_group", groups=choices, layout=layout, names=None if rarely(draw, 4) else names, out=out))
    if out in b.run.handles:
        b.add(step("check", mesh=out))
        b.add(step("compare", a=out, b=handle))


@st.composite
def _edge_request(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    """One request at an edge of DeviceMesh's API, most of which torch must refuse: each kind of edge gets
    its turn, where a random walk would meet it once in hundreds of plans."""
    names = list(mesh.names or ())
    named = well_named(mesh)
    edges = [
        lambda: step("query", mesh=handle, what=draw(st.sampled_from(["get_group", "get_local_rank"]))),
        lambda: step("query", mesh=handle, what="root_mesh_dim"),
        lambda: step("query", mesh=handle, what="mesh"),
        lambda: step("init_device_mesh", shape=[b.world], names=["x", "x"][:draw(st.integers(1, 2))] * 2,
                     out=b.fresh("m")),
        lambda: step("init_device_mesh", shape=list(mesh.shape) or [1], names=[f"d{i}" for i in range(mesh.ndim)],
                     backend_override=[[0, "gloo"], ["d0", "gloo"]], out=b.fresh("m")),
        lambda: step("from_group", groups=[], out=b.fresh("g")),
    ]
    if named and mesh.ndim > 1:
        edges += [
            lambda: step("slice", src=handle, names=names[::-1], out=b.fresh("s")),
            lambda: step("unflatten", src=handle, dim=draw(st.sampled_from([mesh.ndim, "nope"])), sizes=[1],
                         names=[b.fresh("u")], out=b.fresh("u")),
            lambda: step("unflatten", src=handle, dim=0, sizes=[mesh.shape[0], 1], names=[b.fresh("u")],
                         out=b.fresh("u")),
            lambda: step("unflatten", src=handle, dim=0, sizes=[mesh.shape[0] + 1], names=[b.fresh("u")],
                         out=b.fresh("u")),
            lambda: step("from_group", src=handle, dims=[0, 1], layout=list(range(mesh.shape[0])),
                         names=["p", "q"], out=b.fresh("g")),
        ]
    if not mesh.names and mesh.ndim > 1:
        edges.append(lambda: step("from_group", src=handle, dims=[0, 1], out=b.fresh("g")))
    others = [h for h, m in b.meshes() if m.root_mesh is not mesh.root_mesh and well_named(m)]
    if named and others:
        edges.append(lambda: step("concatenate", srcs=[handle, draw(st.sampled_from(others))], out=b.fresh("c")))
    made = draw(st.sampled_from(edges))()
    b.add(made)


COMPOSITIONS = (_flatten_family, _concatenate_both_ways, _unflatten_a_flattened_dim, _submesh_of_submesh,
                _from_hand_made_groups, _edge_request, _edge_request)


@st.composite
def _dtensor_chain(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    """distribute, then a chain of redistributes (nested shardings and shard-to-shard moves among them), each
    seen through to_local now and then, and full_tensor at the end."""
    made = draw(OPERATIONS["distribute"].draw(b, handle, mesh, allow_errors))
    if made is None:
        return
    b.add(made)
    ref = made.out
    for _ in range(draw(st.integers(1, 3))):
        dt = b.run.handles.get(ref)
        if not isinstance(dt, D.DTensorModel):
            return
        out = b.fresh("t")
        b.add(step("redistribute", tensor=ref, placements=draw(redistribute_targets(dt, allow_errors)), out=out))
        ref = out
        if draw(st.booleans()):
            b.add(step("to_local", tensor=ref))
    dt = b.run.handles.get(ref)
    if isinstance(dt, D.DTensorModel) and dt.shape and draw(st.booleans()):
        made = draw(OPERATIONS["sum"].draw(b, handle, mesh, allow_errors))  # a sharded dim summed: Partial
        if made is not None:
            b.add(made)
            ref = made.out
    if ref in b.run.handles:
        b.add(step("full_tensor", tensor=ref))


@st.composite
def _partial_on_equal_dims(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    """from_local of blocks that tell ranks apart, Partial on one of two mesh dims of equal size, then reduced
    by a redistribute or full_tensor: a reduction over the other dim would show in the values."""
    if not usable(mesh) or not mesh.ndim:
        return
    pairs = [(i, j) for i in range(mesh.ndim) for j in range(i + 1, mesh.ndim) if mesh.shape[i] == mesh.shape[j]]
    dims = list(draw(st.sampled_from(pairs))) if pairs else [0]
    partial = draw(st.sampled_from(dims))
    local_shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    placements = ["R"] * mesh.ndim
    placements[partial] = f"P({draw(st.sampled_from(D.REDUCE_OPS))})"
    for d in range(mesh.ndim):
        if d != partial and draw(st.booleans()):
            placements[d] = f"S({draw(st.integers(0, len(local_shape) - 1))})"
    out = b.fresh("t")
    b.add(step("from_local", mesh=handle, local_shape=local_shape, placements=placements, out=out))
    if draw(st.booleans()):
        target = list(placements)
        target[partial] = draw(st.sampled_from(["R", "S(0)"]))
        reduced = b.fresh("t")
        b.add(step("redistribute", tensor=out, placements=target, out=reduced))
        b.add(step("to_local", tensor=reduced))
    b.add(step("full_tensor", tensor=out))


DTENSOR_COMPOSITIONS = (_dtensor_chain, _partial_on_equal_dims)


@st.composite
def dtensor_compositions(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    draw(draw(st.sampled_from(DTENSOR_COMPOSITIONS))(b, handle, mesh, allow_errors))


@st.composite
def compositions(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    draw(draw(st.sampled_from(COMPOSITIONS))(b, handle, mesh, allow_errors))


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
    kind = draw(st.sampled_from(["skip", "shape", "raise", "exit", "kill", "sleep", "order"]))
    if kind == "skip":
        steps_.append(step("all_reduce", mesh="m", dim=dim, skip_on=[rank]))
    elif kind == "shape" and len(shape) > 1:
        steps_.append(step("init_device_mesh", shape=list(reversed(shape)), names=names, out="n",
                           on_rank={rank: {"shape": [math.prod(shape)], "names": ["flat"]}}))
    elif kind in ("raise", "exit", "kill", "sleep"):
        steps_.append(draw(OPERATIONS[kind].draw(_Builder(world), None, None, False)))
    else:
        other = draw(st.sampled_from(names))
        steps_ += [step("all_reduce", mesh="m", dim=dim, skip_on=[rank]),
                   step("all_reduce", mesh="m", dim=other),
                   step("all_reduce", mesh="m", dim=dim, only_on=[rank])]
    steps_.append(step("check", mesh="m"))
    return Plan(tuple(steps_))
