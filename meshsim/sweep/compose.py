"""Mesh compositions: chains of DeviceMesh steps a random walk rarely completes (flatten families, concatenations
both ways, unflattens of flattened dims, submeshes of submeshes, meshes from hand-made groups, requests at the API's
edges). Each adds its steps to the plan being built (meshsim.sweep.strategies._Builder), with the model following."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ..model.mesh import MeshModel
from ..ops import OPERATIONS, rarely
from ..ops.meshes import well_named
from ..spec.plan import step

# --------------------------------------------------------------------------------------------- compositions
# Chains a random walk rarely completes: each adds its steps to the plan being built, with the model following.


@st.composite
def _flatten_family(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
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
def _concatenate_both_ways(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
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
def _unflatten_a_flattened_dim(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
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
def _submesh_of_submesh(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
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
def _from_hand_made_groups(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
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
def _edge_request(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
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
def compositions(draw: Any, b: Any, handle: str, mesh: MeshModel, allow_errors: bool) -> None:
    draw(draw(st.sampled_from(COMPOSITIONS))(b, handle, mesh, allow_errors))
