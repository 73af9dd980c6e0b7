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

from ..model import dtensor as D
from ..model.mesh import MeshModel
from ..model.predict import RankRun, observe_step
from ..ops import OPERATIONS, of_role, rarely
from ..ops.dtensor import redistribute_targets, usable
from ..ops.meshes import dim_names, mesh_shapes, rank_layouts, well_named  # noqa: F401 -- part of this module's API
from ..spec.placements import placement_text
from ..spec.plan import Plan, Step, step
from ..spec.platform import Platform
from ..spec.topology import Topology


def topologies(max_world: int = 16, max_hosts: int = 4, max_devices: int = 8) -> st.SearchStrategy[Topology]:
    return st.builds(Topology, st.integers(1, max_hosts), st.integers(1, max_devices)).filter(
        lambda t: t.world <= max_world)


# --------------------------------------------------------------------------------------------- plans


class _Builder:
    """A plan being drawn, with the model following rank 0 to know what each handle holds. `device`: the device
    type the cluster's backend serves, the one an explicit `device=` names (cpu on gloo, cuda on NCCL);
    `platform`: the torch the ranks run (its release decides which operations exist)."""

    def __init__(self, world: int, device: str = "cpu", platform: Platform | None = None):
        self.world = world
        self.device = device
        self.run = RankRun(Plan(()), 0, world, platform or Platform())
        self.platform = self.run.model.platform
        self.steps: list[Step] = []
        self.left_out: set[str] = set()  # handles of steps the release cannot run (meshsim.model.semantics)
        self.counter = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def add(self, st_: Step) -> None:
        if not self._available(st_):
            return
        self.run.model.step = len(self.steps)
        try:
            observe_step(self.run, st_, st_.args_for(0), len(self.steps))
        except Exception:  # noqa: BLE001 -- a model that fails here is judged when the plan runs
            pass
        self.steps.append(st_)

    def _available(self, st_: Step) -> bool:
        """Whether the release the ranks run has the step's op, and every handle it names was made: a step of an
        op the release lacks is left out, and so is every step that uses what it would have made."""
        names = [v for value in st_.args.values() for v in (value if isinstance(value, list) else [value])
                 if isinstance(v, str)]
        if OPERATIONS[st_.op].available(self.platform, dict(st_.args)) and \
                not any(n.split(".")[0] in self.left_out for n in names):
            return True
        if st_.out:
            self.left_out.add(st_.out)
        return False

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
          check_every_mesh: bool = False, root_numel: int | None = None, device: str = "cpu",
          platform: Platform | None = None) -> Plan:
    """SPMD plans: a root mesh, then more roots, derived meshes, deep compositions, queries, collectives and
    checks that use earlier results.

    Each plan enables a random subset of the operations (swarm testing), so rare combinations get room.
    """
    b = _Builder(world, device, platform)
    b.add(draw(root_steps(world, allow_errors, numel=root_numel, builder=b)))
    names = sorted(n for n in WEIGHTS if n not in OPERATIONS or OPERATIONS[n].available(b.platform))
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
    if "dtensor" in enabled and b.meshes() and rarely(draw, 3):
        # a cell of the redistribute matrix, drawn directly (a random walk reaches few; drawn last, where shrinking
        # drops it first): a sweep produces and checks every cell, under every condition (meshsim.sweep.produced)
        handle, mesh = b.meshes()[0]
        draw(_transform_cells(b, handle, mesh, allow_errors))
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
    from ..model import layout as L

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


# --------------------------------------------------------------------------------------------- the redistribute matrix
# Each cell of meshsim.sweep.produced's matrix (where on the mesh, from which placement, to which) is drawn directly: a
# random walk reaches a Partial(min) -> Shard move on a mesh's outer dim once in thousands of plans.


def _fitting(mesh: MeshModel, position: str) -> list[int]:
    """The mesh dims where `position` is (1-D, outer, inner) and something can move (size > 1)."""
    if not usable(mesh) or not well_named(mesh):
        return []
    dims = [0] if position == "1-D" and mesh.ndim == 1 else [0] if position == "outer" and mesh.ndim > 1 else \
        list(range(1, mesh.ndim)) if position == "inner" else []
    return [d for d in dims if mesh.shape[d] > 1]


@st.composite
def _mesh_for(draw: Any, b: _Builder, handle: str, mesh: MeshModel, position: str) -> tuple[str, MeshModel, int]:
    """A named mesh with a dim at `position`: the one at hand, else a new root that has one, and now and then a
    mesh derived from it (an unflatten, a slice) for the DTensor to live on."""
    if not _fitting(mesh, position) or draw(st.booleans()):
        if position == "1-D":
            shape = [b.world]
        else:
            shapes = [s for s in _factorisations(b.world) if len(s) > 1 and
                      (s[0] > 1 if position == "outer" else any(n > 1 for n in s[1:]))]
            if not shapes:
                return handle, mesh, -1
            shape = list(draw(st.sampled_from(shapes)))
        handle = b.fresh("m")
        b.add(step("init_device_mesh", shape=shape, names=[f"{handle}d{i}" for i in range(len(shape))], out=handle))
        mesh = b.run.handles[handle]
        if position != "1-D" and rarely(draw, 3):
            derived = draw(_derived_for(b, handle, mesh, position))
            if derived is not None:
                handle, mesh = derived
    dims = _fitting(mesh, position)
    return (handle, mesh, draw(st.sampled_from(dims))) if dims else (handle, mesh, -1)


@st.composite
def _derived_for(draw: Any, b: _Builder, handle: str, mesh: MeshModel, position: str) -> tuple[str, MeshModel] | None:
    """The same dims seen through a derived mesh: a 1-D root unflattened, or a root's slice of all its dims."""
    out = b.fresh("v")
    if draw(st.booleans()):
        flat = b.fresh("f")
        b.add(step("flatten", src=handle, name=b.fresh("fn"), out=flat))
        b.add(step("unflatten", src=flat, dim=0, sizes=list(mesh.shape), names=[f"{out}d{i}" for i in range(mesh.ndim)],
                   out=out))
    else:
        b.add(step("slice", src=handle, names=list(mesh.names or ()), out=out))
    value = b.run.handles.get(out)
    return (out, value) if isinstance(value, MeshModel) and _fitting(value, position) else None


def _factorisations(world: int) -> list[tuple[int, ...]]:
    """Shapes of two or three dims whose product is the world, size-1 dims among them."""
    divisors = [n for n in range(1, world + 1) if world % n == 0]
    shapes: set[tuple[int, ...]] = {(a, world // a) for a in divisors}
    shapes |= {(a, b, world // (a * b)) for a in divisors for b in divisors if world % (a * b) == 0}
    return sorted(shapes)


@st.composite
def _source(draw: Any, b: _Builder, handle: str, mesh: MeshModel, d: int, kind: str) -> str | None:
    """A DTensor with `kind` (R, S, P(op)) at mesh dim d and drawn placements elsewhere: Partials come from
    from_local blocks that tell ranks apart (a reduction over the wrong dim shows), the rest from distribute."""
    partial = kind.startswith("P")
    placements = []
    for i in range(mesh.ndim):
        if i == d:
            placements.append(kind if kind != "S" else "S(0)")
        else:
            other = draw(st.sampled_from(["R", "S", "same"] + (["P(avg)"] if kind == "P(sum)" else [])))
            placements.append(kind if other == "same" and partial else "R" if other in ("R", "same") else other)
    out = b.fresh("t")
    if partial:
        local = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
        placements = [p if p != "S" else f"S({draw(st.integers(0, len(local) - 1))})" for p in placements]
        b.add(step("from_local", mesh=handle, local_shape=local, placements=placements, out=out))
    else:
        shape = draw(st.lists(st.sampled_from(sorted({1, 2, 3, 4, 5, 6, 7, 8, 9} | set(mesh.shape))), min_size=1,
                              max_size=3))
        placements = [p if p != "S" else f"S({draw(st.integers(0, len(shape) - 1))})" for p in placements]
        b.add(step("distribute", mesh=handle, shape=shape, placements=placements, out=out))
    return out if out in b.run.handles else None


@st.composite
def _transform_cells(draw: Any, b: _Builder, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    """One cell's source at a drawn position, redistributed to both targets there (Replicate and a Shard), the
    Shard then moved to another tensor dim and gathered: four cells of the matrix from one source, on a root that
    is flattened first now and then (torch then merges collectives), on a derived mesh now and then, and with the
    same root derived again afterwards."""
    position = draw(st.sampled_from(["1-D", "outer", "inner"]))
    handle, mesh, d = draw(_mesh_for(b, handle, mesh, position))
    if d < 0:
        return
    if mesh.ndim > 1 and rarely(draw, 3):
        b.add(step("flatten", src=handle, name=b.fresh("fn"), out=b.fresh("f")))  # torch merges onto it
    if draw(st.integers(0, 7)) == 0:  # 0 is where shrinking goes: a failure that needs only the meshes (the
        return                        # flattened one too) loses the DTensor steps
    kind = draw(st.sampled_from(["R", "S", "P(sum)", "P(avg)", "P(max)", "P(min)"]))
    source = draw(_source(b, handle, mesh, d, kind))
    dt = b.run.handles.get(source) if source else None
    if not isinstance(dt, D.DTensorModel):
        return
    sharded = None
    for target in draw(st.permutations(["R", "S"])):
        placements = [placement_text(p) for p in dt.placements]
        placements[d] = "R" if target == "R" else f"S({draw(st.integers(0, len(dt.shape) - 1))})"
        others = [i for i in range(mesh.ndim) if i != d]
        if others and rarely(draw, 3):  # another dim moves too: nested shards, merged collectives
            other = draw(st.sampled_from(others))
            if dt.placements[other][0] != "P":
                placements[other] = draw(st.sampled_from(["R", placements[d]]))
        if target == "S" and placements[d] == placement_text(dt.placements[d]):
            continue
        out = b.fresh("t")
        b.add(step("redistribute", tensor=source, placements=placements, out=out))
        if target == "S" and out in b.run.handles:
            sharded = out
    draw(_onward(b, sharded, d))


@st.composite
def _onward(draw: Any, b: _Builder, ref: str | None, d: int) -> None:
    """A Shard at mesh dim d moved to another tensor dim (all_to_all) and gathered, with a look at its blocks."""
    dt = b.run.handles.get(ref) if ref else None
    if ref is None or not isinstance(dt, D.DTensorModel):
        return
    if len(dt.shape) > 1 and dt.placements[d][0] == "S":
        placements = [placement_text(p) for p in dt.placements]
        current = dt.placements[d][1]
        placements[d] = f"S({draw(st.sampled_from([i for i in range(len(dt.shape)) if i != current]))})"
        moved = b.fresh("t")
        b.add(step("redistribute", tensor=ref, placements=placements, out=moved))
        if moved in b.run.handles:
            ref = moved
    if draw(st.booleans()):
        b.add(step("to_local", tensor=ref))
    b.add(step("full_tensor", tensor=ref))
    if rarely(draw, 3):  # summed over a dim its shards may be on: Partial(sum) where they were
        b.add(step("sum", tensor=ref, dim=draw(st.integers(0, len(dt.shape) - 1)), out=b.fresh("t")))
    if rarely(draw, 3):
        draw(_derived_after(b, ref))


@st.composite
def _derived_after(draw: Any, b: _Builder, ref: str) -> None:
    """The DTensor's root derived again (flattened, sliced) after its redistributes, and the DTensor's blocks put
    on the derived mesh."""
    dt = b.run.handles[ref]
    mesh = dt.mesh
    root = next((h for h, m in b.meshes() if m is mesh.root_mesh), None)
    if root is None or not well_named(mesh.root_mesh) or mesh.root_mesh.ndim < 2:
        return
    out = b.fresh("v")
    if draw(st.booleans()):
        b.add(step("flatten", src=root, name=b.fresh("fn"), out=out))
    else:
        b.add(step("slice", src=root, names=list(mesh.root_mesh.names or ())[1:], out=out))
    derived = b.run.handles.get(out)
    if isinstance(derived, MeshModel) and usable(derived):
        placements = ["R"] * derived.ndim
        made = b.fresh("t")
        b.add(step("from_local", mesh=out, tensor=ref, placements=placements, out=made))
        b.add(step("full_tensor", tensor=made))


DTENSOR_COMPOSITIONS = (_transform_cells, _transform_cells, _dtensor_chain, _partial_on_equal_dims)


def matrix_plans(world: int) -> list[Plan]:
    """Plans that produce and check every cell of the redistribute matrix and every kind of derived mesh at
    least once: a sweep runs them first, so its reach does not hang on what the draws happen to hit. For each
    position and source placement, a source redistributed to Replicate and to a Shard there, the Shard moved to
    another tensor dim and gathered, on shapes that do not divide the mesh."""
    two = [s for s in _factorisations(world) if len(s) == 2 and s[0] > 1 and s[1] > 1]
    three = [s for s in _factorisations(world) if len(s) == 3 and min(s) > 1]
    where = [([world], 0)]  # (mesh shape, mesh dim): a 1-D mesh's dim, an outer, an inner and a middle one
    where += [(list(two[0]), 0), (list(two[0]), 1)] if two else []
    where += [(list(three[0]), 1)] if three else []
    out = []
    for shape, d in where:
        for kind in ("R", "S", "P(sum)", "P(avg)", "P(max)", "P(min)"):
            out.append(_steps_the_release_has(world, _matrix_steps(shape, d, kind)))
    if two:
        for steps in (_every_derived_mesh, _conditions, _dtensor_edges, _device_mesh_edges):
            out.append(_steps_the_release_has(world, steps(list(two[0]))))
    return out


def _steps_the_release_has(world: int, steps: list[Step]) -> Plan:
    b = _Builder(world)
    kept = [st_ for st_ in steps if b._available(st_)]
    return Plan(tuple(kept))


def _matrix_steps(shape: list[int], d: int, kind: str) -> list[Step]:
    names = [f"d{i}" for i in range(len(shape))]
    steps = [step("init_device_mesh", shape=shape, names=names, out="m")]
    placements = ["R"] * len(shape)
    placements[d] = "S(0)" if kind == "S" else kind
    if kind.startswith("P"):
        steps.append(step("from_local", mesh="m", local_shape=[3, 2], placements=placements, out="t"))
    else:
        steps.append(step("distribute", mesh="m", shape=[shape[d] + 1, 3], placements=placements, out="t"))
    if kind == "P(sum)" and len(shape) > 1:
        placements[1 - d] = "P(avg)"  # torch 2.13 lets sum and avg Partials share a DTensor
    to_r, to_s, moved = list(placements), list(placements), list(placements)
    to_r[d], to_s[d], moved[d] = "R", "S(1)" if kind == "S" else "S(0)", "S(0)" if kind == "S" else "S(1)"
    steps += [step("redistribute", tensor="t", placements=to_r, out="r"),
              step("redistribute", tensor="t", placements=to_s, out="s"),
              step("redistribute", tensor="s", placements=moved, out="u"),
              step("to_local", tensor="u"), step("full_tensor", tensor="u")]
    return steps


def _conditions(shape: list[int]) -> list[Step]:
    """Redistributes under the conditions meshsim.sweep.produced counts: merged onto a flattened root, nested and
    uneven shards, on a derived mesh with a size-1 dim, and the root derived again afterwards."""
    a, b = shape
    return [step("init_device_mesh", shape=[a, 1, b], names=["a", "one", "b"], out="m"),
            step("flatten", src="m", out="f"),
            step("distribute", mesh="m", shape=[a * b + 1], placements=["S(0)", "R", "S(0)"], out="t"),
            step("full_tensor", tensor="t"),
            step("from_local", mesh="m", local_shape=[a * b], placements=["P(sum)", "R", "P(avg)"], out="p"),
            step("redistribute", tensor="p", placements=["R", "R", "R"], out="q"), step("to_local", tensor="q"),
            step("redistribute", tensor="p", placements=["S(0)", "R", "S(0)"], out="q2"),  # one reduce_scatter
            step("to_local", tensor="q2"),
            step("from_local", mesh="m", local_shape=[a * b + 1], placements=["P(max)", "R", "P(max)"], out="p3"),
            step("redistribute", tensor="p3", placements=["S(0)", "R", "S(0)"], out="q3"),  # uneven: not merged
            step("to_local", tensor="q3"),
            step("slice", src="m", names=["a", "b"], out="s"),
            step("distribute", mesh="s", shape=[b + 1, 2], placements=["S(1)", "S(0)"], out="u"),
            step("redistribute", tensor="u", placements=["R", "S(1)"], out="v"), step("full_tensor", tensor="v"),
            step("unflatten", src="f", dim=0, sizes=[a, b], names=["x", "y"], out="g"),
            step("from_local", mesh="g", tensor="v", placements=["R", "S(1)"], out="w"),
            step("full_tensor", tensor="w")]


def _dtensor_edges(shape: list[int]) -> list[Step]:
    """DTensor's API at its edges: Partial placements distributed, a redistribute that changes nothing, from_local
    with a given shape and run_check, a negative Shard dim, torch.sum of Partials it must reduce first, and the
    requests torch refuses (mixed reduce ops, a new Partial, too many placements, a dim the tensor lacks)."""
    a, b = shape
    world = a * b
    return [step("init_device_mesh", shape=[world], names=["w"], out="w"),
            step("init_device_mesh", shape=shape, names=["a", "b"], out="m"),
            step("distribute", mesh="m", shape=[b, 3], placements=["P(sum)", "P(avg)"], out="p"),
            step("to_local", tensor="p"),
            step("distribute", mesh="w", shape=[world + 1], placements=["S(0)"], out="t"),
            step("redistribute", tensor="t", placements=["S(0)"], out="same"), step("to_local", tensor="same"),
            step("from_local", mesh="w", tensor="t", placements=["S(-1)"], shape=[world + 1], run_check=True,
                 out="given"),
            step("full_tensor", tensor="given"),
            step("from_local", mesh="w", tensor="t", placements=["S(0)"], run_check=True, out="inferred"),
            step("from_local", mesh="m", local_shape=[2, 3], placements=["R", "S(1)"], run_check=True, out="r"),
            step("to_local", tensor="r"),
            step("from_local", mesh="m", local_shape=[2, 3], placements=["P(max)", "S(0)"], out="mx"),
            step("sum", tensor="mx", dim=0, out="s0"), step("to_local", tensor="s0"),
            step("sum", tensor="mx", dim=1, out="s1"), step("to_local", tensor="s1"),
            step("sum", tensor="p", dim=-1, out="s2"), step("to_local", tensor="s2"),
            step("distribute", mesh="m", shape=[3], placements=["R", "R"], out="rr"),
            step("sum", tensor="rr", dim=0, out="s3"), step("to_local", tensor="s3"),
            step("distribute", mesh="m", shape=[b + 1, 5], placements=["S(0)", "S(1)"], out="ss"),
            step("full_tensor", tensor="ss"),
            step("from_local", mesh="m", local_shape=[2], placements=["P(sum)", "P(max)"], out="mixed"),
            step("redistribute", tensor="mx", placements=["P(sum)", "S(0)"], out="np"),
            step("distribute", mesh="m", shape=[3], placements=["R", "R", "R"], out="long"),
            step("distribute", mesh="m", shape=[3], placements=["R", "S(1)"], out="nodim")]


def _device_mesh_edges(shape: list[int]) -> list[Step]:
    """DeviceMesh's requests at their edges, most of them refused: a dim left out, names that do not exist, slicing
    out of order, unflatten sizes that do not multiply, flatten onto a taken name, from_group without what n
    groups need, backend_override keys that are not dims, a root dim asked of a 2-D mesh."""
    a, b = shape
    return [step("init_device_mesh", shape=shape, names=["a", "b"], out="m"),
            step("query", mesh="m", what="get_group"), step("query", mesh="m", what="get_local_rank"),
            step("query", mesh="m", what="root_mesh_dim"), step("slice", src="m", names=["b", "a"], out="x1"),
            step("slice", src="m", names="nope", out="x2"), step("slice", src="m", names=["a", "a"], out="x3"),
            step("unflatten", src="m", dim="b", sizes=[b + 1], names=["u"], out="x4"),
            step("unflatten", src="m", dim=2, sizes=[b], names=["u"], out="x5"),
            step("unflatten", src="m", dim="b", sizes=[b, 1], names=["u"], out="x6"),
            step("flatten", src="m", name="a", out="x7"),
            step("from_group", src="m", dims=[0, 1], layout=list(range(a)), names=["p", "q"], out="x8"),
            step("from_group", groups=[], out="x9"),
            step("init_device_mesh", shape=shape, names=["a", "b"], backend_override=[[0, "gloo"], ["a", "gloo"]],
                 out="x10"),
            step("init_device_mesh", shape=[a * b], names=["w", "w"], out="x11"),
            step("init_device_mesh", shape=shape, names=["w"], out="x13"),
            step("init_device_mesh", shape=shape, out="unnamed"), step("slice", src="unnamed", names="a", out="x12"),
            step("slice", src="m", names="a", out="sa"), step("slice", src="m", names="b", out="sb"),
            step("concatenate", srcs=["sb", "sa"], out="x14"), step("concatenate", srcs=["sa", "sa"], out="x15"),
            step("init_device_mesh", shape=shape, names=["c", "d"], out="n"),
            step("slice", src="n", names="d", out="nd"),
            step("concatenate", srcs=["sa", "nd"], out="x16"),
            step("flatten", src="m", name="ab", out="f"), step("slice", src="sb", names="ab", out="x17"),
            step("query", mesh="sa", what="get_group", dim="ab"),
            step("unflatten", src="f", dim=0, sizes=[a, b], names=["p", "q"], backend_override=[[0, "gloo"]],
                 out="u"), step("check", mesh="u"),
            step("mesh", layout=list(range(a * b)), init_backend=False, out="nb"),
            step("query", mesh="nb", what="get_group"), step("flatten", src="nb", out="x18"),
            step("check", mesh="m")]


def _every_derived_mesh(shape: list[int]) -> list[Step]:
    """Each kind of derived mesh made from one root and checked."""
    a, b = shape
    groups = [step("new_group", ranks=list(range(i, a * b, b)), out=f"r{i}") for i in range(b)]  # dim a's lines
    groups += [step("new_group", ranks=list(range(i * b, (i + 1) * b)), out=f"c{i}") for i in range(a)]  # dim b's
    return [step("init_device_mesh", shape=shape, names=["a", "b"], out="m"), *groups,
            step("slice", src="m", names="a", out="sa"), step("slice", src="m", names="b", out="sb"),
            step("concatenate", srcs=["sa", "sb"], out="c"), step("check", mesh="c"),
            step("flatten", src="m", out="f"), step("check", mesh="f"),
            step("unflatten", src="f", dim=0, sizes=list(shape), names=["x", "y"], out="u"), step("check", mesh="u"),
            step("from_group", src="m", dims=["b"], out="g"), step("check", mesh="g"),
            step("from_group", groups=[[f"r{i}" for i in range(shape[1])], [f"c{i}" for i in range(shape[0])]],
                 layout=[list(range(i * shape[1], (i + 1) * shape[1])) for i in range(shape[0])], names=["x", "y"],
                 out="h"), step("check", mesh="h"),
            step("all_submeshes", src="m", dim="b", out="l"), step("check", mesh="l.0")]


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
