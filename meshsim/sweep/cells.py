"""DTensor draws: chains of redistributes, Partials on mesh dims of equal size, and each cell of the redistribute
matrix (meshsim.sweep.produced) drawn directly, on meshes derived now and then. Each adds its steps to the plan
being built (meshsim.sweep.strategies._Builder), with the model following."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ..model import dtensor as D
from ..model.mesh import MeshModel
from ..ops import OPERATIONS, rarely
from ..ops.dtensor import redistribute_targets, usable, within_numel
from ..ops.meshes import well_named
from ..spec.placements import placement_text
from ..spec.plan import step
from .matrix import factorisations


@st.composite
def _dtensor_chain(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
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
def _partial_on_equal_dims(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
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
def _mesh_for(draw: Any, b: Any, handle: str, mesh: MeshModel, position: str) -> tuple[str, MeshModel, int]:
    """A named mesh with a dim at `position`: the one at hand, else a new root that has one, and now and then a
    mesh derived from it (an unflatten, a slice) for the DTensor to live on."""
    if not _fitting(mesh, position) or draw(st.booleans()):
        if position == "1-D":
            shape = [b.world]
        else:
            shapes = [s for s in factorisations(b.world) if len(s) > 1 and
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
def _derived_for(draw: Any, b: Any, handle: str, mesh: MeshModel, position: str) -> tuple[str, MeshModel] | None:
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


@st.composite
def _source(draw: Any, b: Any, handle: str, mesh: MeshModel, d: int, kind: str) -> str | None:
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
        shape = within_numel(draw(st.lists(st.sampled_from(sorted({1, 2, 3, 4, 5, 6, 7, 8, 9} | set(mesh.shape))),
                                           min_size=1, max_size=3)))
        placements = [p if p != "S" else f"S({draw(st.integers(0, len(shape) - 1))})" for p in placements]
        b.add(step("distribute", mesh=handle, shape=shape, placements=placements, out=out))
    return out if out in b.run.handles else None


@st.composite
def transform_cells(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
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
def _onward(draw: Any, b: Any, ref: str | None, d: int) -> None:
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
def _derived_after(draw: Any, b: Any, ref: str) -> None:
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


DTENSOR_COMPOSITIONS = (transform_cells, transform_cells, _dtensor_chain, _partial_on_equal_dims)


@st.composite
def dtensor_compositions(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    draw(draw(st.sampled_from(DTENSOR_COMPOSITIONS))(b, handle, mesh, allow_errors))
