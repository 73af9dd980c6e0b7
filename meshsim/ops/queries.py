"""Operations that ask a mesh about itself, and `check`, which asks everything and runs every collective."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from ..compat.api import mesh_dim_by_name, root_mesh, root_mesh_dim
from ..core.wire import error_value
from ..spec import fields as F
from ..spec.plan import step
from . import collectives as C
from .meshes import names_of
from .registry import operation


def _model_attempt(fn: Any, *args: Any) -> Any:
    from ..model.expect import ModelRaise

    try:
        return fn(*args)
    except ModelRaise as exc:
        return exc.err


def _torch_attempt(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        return error_value(exc)


def mesh_summary(mesh: Any, view_of: Any = None) -> dict:
    """The cheap facts every mesh-producing step records, of a torch DeviceMesh (`view_of`: how the executor
    observes the mesh tensor; a plain list unless it is too large to ship)."""
    try:
        view: Any = view_of(mesh) if view_of is not None else mesh.mesh.tolist()
    except Exception as exc:
        view = error_value(exc)
    return {"shape": list(mesh.shape), "ndim": mesh.ndim,
            "names": list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
            "coordinate": torch_coordinate(mesh), "mesh": view}


def torch_coordinate(mesh: Any) -> list[int] | None:
    coordinate = mesh.get_coordinate()
    return list(coordinate) if coordinate is not None else None


@operation("query", "query", {"mesh": F.MESH, "what": F.QUERY, "dim": F.DIM}, ("mesh", "what"), weight=4)
class Query:
    """one DeviceMesh query: get_group, get_all_groups, get_local_rank, get_coordinate, size, shape, ndim, mesh,
    mesh_dim_names; group_desc (of get_group(dim)), default_group (whether get_group(dim) is the default group
    object), root_mesh_dim (_get_root_mesh_dim()), device_type, current (`with mesh:` makes it the current mesh),
    dim_by_name (_get_mesh_dim_by_name(dim)), bound_device_id (of get_group(dim): None unless NCCL was eagerly
    initialised)"""

    def model(run: Any, a: dict) -> Any:
        model, mesh, dim, what = run.model, run.mesh(a["mesh"]), a.get("dim"), a["what"]
        if what == "dim_by_name":
            return model.dim_by_name(mesh, dim)
        if what == "bound_device_id":
            model.get_group(mesh, dim)  # its errors
            return None  # meshsim's ranks join the world lazily: no group is bound to a device
        if what == "group_desc":
            return model.get_group(mesh, dim).desc
        if what == "default_group":
            return model.get_group(mesh, dim).key == model.world_group.key
        if what == "root_mesh_dim":
            return model.root_mesh_dim(mesh)
        if what == "device_type":
            return mesh.device
        if what == "current":
            return True
        if what == "get_group":
            return model.group_observation(mesh, dim)
        if what == "get_all_groups":
            return [model.group_observation(mesh, i) for i in range(mesh.ndim)]
        if what == "get_local_rank":
            return model.local_rank_observation(mesh, dim)
        if what == "get_coordinate":
            return list(mesh.coordinate) if mesh.coordinate is not None else None
        if what == "size":
            return model.size(mesh, dim)
        if what == "shape":
            return list(mesh.shape)
        if what == "ndim":
            return mesh.ndim
        if what == "mesh":
            return model.mesh_view(mesh)
        return list(mesh.names) if mesh.names else None

    def torch(ex: Any, a: dict) -> Any:
        import torch.distributed as dist

        mesh, dim, what = ex.mesh(a["mesh"]), a.get("dim"), a["what"]
        if what == "dim_by_name":
            return mesh_dim_by_name(mesh, dim)
        if what == "bound_device_id":
            bound = mesh.get_group(dim).bound_device_id
            return str(bound) if bound is not None else None
        if what == "group_desc":
            return mesh.get_group(dim).group_desc
        if what == "default_group":
            return mesh.get_group(dim) is dist.distributed_c10d._get_default_group()
        if what == "root_mesh_dim":
            return root_mesh_dim(mesh)
        if what == "device_type":
            return mesh.device_type
        if what == "current":
            from torch.distributed.device_mesh import _mesh_resources

            with mesh:
                return _mesh_resources.get_current_mesh() is mesh
        if what == "get_group":
            return dist.get_process_group_ranks(mesh.get_group(dim))
        if what == "get_all_groups":
            return [dist.get_process_group_ranks(g) for g in mesh.get_all_groups()]
        if what == "get_local_rank":
            return mesh.get_local_rank(dim)
        if what == "get_coordinate":
            return torch_coordinate(mesh)
        if what == "size":
            return mesh.size(dim)
        if what == "shape":
            return list(mesh.shape)
        if what == "ndim":
            return mesh.ndim
        if what == "mesh":
            return ex.view_of(mesh)
        return list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        what = draw(st.sampled_from(F.QUERIES))
        dim: Any = None
        if what == "dim_by_name":
            return step("query", mesh=handle, what=what, dim=draw(st.sampled_from(
                names_of(mesh) + (["nope"] if allow_errors or not mesh.names else []))))
        if what in ("get_group", "get_local_rank", "size", "group_desc", "default_group", "bound_device_id") and (
                draw(st.integers(0, 5)) > 0 if mesh.ndim > 1 else draw(st.booleans())):
            choices: list[Any] = list(range(mesh.ndim)) + names_of(mesh)
            if mesh.root is None and mesh.flatten_mapping:  # a root answers for the dims flattened from it
                choices += list(mesh.flatten_mapping)
            if allow_errors:
                choices += [mesh.ndim, "nope"]
            dim = draw(st.sampled_from(choices))
        return step("query", mesh=handle, what=what, dim=dim)


@operation("get_rank", "query", {"mesh": F.MESH}, ("mesh",), weight=2)
class GetRank:
    """mesh.get_rank(): this rank's global rank, asked of a mesh"""

    def model(run: Any, a: dict) -> Any:
        run.mesh(a["mesh"])
        return run.model.rank

    def torch(ex: Any, a: dict) -> Any:
        return ex.mesh(a["mesh"]).get_rank()

    def draw(b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return st.just(step("get_rank", mesh=handle))


@operation("check", "query", {"mesh": F.MESH, "collectives": F.BOOL}, ("mesh",), weight=2)
class Check:
    """every query, and all_reduce/all_gather/broadcast along every dim"""

    def model(run: Any, a: dict) -> Any:
        from ..model.expect import ModelRaise, Quirk
        from ..model.mesh import summary

        model, mesh = run.model, run.mesh(a["mesh"])
        obs = summary(mesh)
        if isinstance(obs, Quirk):
            obs = obs.torch
        obs = dict(obs, size=math.prod(mesh.shape), dims=[])
        for index in range(mesh.ndim):
            entry: dict[str, Any] = {"size": model.size(mesh, index)}
            try:
                group = model.get_group(mesh, index)
            except ModelRaise as exc:
                entry["group"] = exc.err
                obs["dims"].append(entry)
                continue
            entry["group"] = model.group_observation(mesh, index)
            entry["local_rank"] = model.local_rank_observation(mesh, index)
            if mesh.names and index < len(mesh.names):  # from_group lets names of the wrong length through
                name = mesh.names[index]
                entry["group_by_name"] = _model_attempt(model.group_observation, mesh, name)
                entry["local_rank_by_name"] = _model_attempt(model.local_rank_observation, mesh, name)
            if a.get("collectives", True):
                model.context = (a["mesh"], mesh.names[index] if mesh.names and index < len(mesh.names) else index)
                entry["all_reduce"] = C.all_reduce_expected(model, group, model.world)
                entry["all_gather"] = C.all_gather_expected(model, group)
                entry["broadcast"] = C.broadcast_expected(model, group, 0)
                model.context = None
            obs["dims"].append(entry)
        obs["all_groups"] = _model_attempt(lambda: [model.group_observation(mesh, i) for i in range(mesh.ndim)])
        return obs

    def torch(ex: Any, a: dict) -> Any:
        import torch.distributed as dist

        handle = a["mesh"]
        mesh = ex.mesh(handle)
        obs = dict(mesh_summary(mesh, ex.view_of), size=mesh.size(), dims=[])
        names = mesh.mesh_dim_names
        for index in range(mesh.ndim):
            entry: dict[str, Any] = {"size": mesh.size(index)}
            try:
                group = mesh.get_group(index)
            except Exception as exc:
                entry["group"] = error_value(exc)
                obs["dims"].append(entry)
                continue
            entry["group"] = dist.get_process_group_ranks(group)
            entry["local_rank"] = mesh.get_local_rank(index)
            if names and index < len(names):
                name = names[index]
                entry["group_by_name"] = _torch_attempt(lambda n: dist.get_process_group_ranks(mesh.get_group(n)), name)
                entry["local_rank_by_name"] = _torch_attempt(mesh.get_local_rank, name)
            if a.get("collectives", True):
                ex.progress.context = (handle, names[index] if names and index < len(names) else index)
                device = ex.device_of(mesh.device_type)
                entry["all_reduce"] = C.all_reduce_performed(ex, group, device, ex.world)
                entry["all_gather"] = C.all_gather_performed(ex, group, device)
                entry["broadcast"] = C.broadcast_performed(ex, group, device, 0)
            obs["dims"].append(entry)
        obs["all_groups"] = _torch_attempt(lambda: [dist.get_process_group_ranks(g) for g in mesh.get_all_groups()])
        return obs

    def draw(b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return st.just(step("check", mesh=handle))


@operation("compare", "query", {"a": F.MESH, "b": F.MESH, "dim_a": F.DIM, "dim_b": F.DIM}, ("a", "b"), weight=1)
class Compare:
    """identity of two meshes (a == b, hash(a) == hash(b), a is b), or with dim_a/dim_b of their groups
    (a.get_group(dim_a) is b.get_group(dim_b), and their ranks are equal)"""

    def model(run: Any, a: dict) -> Any:
        model, left, right = run.model, run.mesh(a["a"]), run.mesh(a["b"])
        if "dim_a" in a or "dim_b" in a:
            ga, gb = model.get_group(left, a.get("dim_a")), model.get_group(right, a.get("dim_b"))
            return {"same_group": ga.key == gb.key, "same_ranks": ga.ranks == gb.ranks}
        same = left.same_as(right)
        return {"equal": same, "same_hash": same, "same_stable_hash": same, "same_object": left is right}

    def torch(ex: Any, a: dict) -> Any:
        import torch.distributed as dist

        left, right = ex.mesh(a["a"]), ex.mesh(a["b"])
        if "dim_a" in a or "dim_b" in a:
            ga, gb = left.get_group(a.get("dim_a")), right.get_group(a.get("dim_b"))
            return {"same_group": ga is gb,
                    "same_ranks": dist.get_process_group_ranks(ga) == dist.get_process_group_ranks(gb)}
        equal = left == right
        # DeviceMesh._stable_hash is newer than torch 2.11 (met on a GPU machine): there, equality stands in
        # for it, so the observation keeps its shape and claims nothing the other fields do not already say.
        stable = left._stable_hash() == right._stable_hash() if hasattr(left, "_stable_hash") else equal
        return {"equal": equal, "same_hash": hash(left) == hash(right), "same_stable_hash": stable,
                "same_object": left is right}

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        other, other_mesh = draw(st.sampled_from(b.meshes()))
        if draw(st.booleans()) and mesh.ndim and other_mesh.ndim:
            dims = {"dim_a": draw(st.sampled_from(list(range(mesh.ndim)) + names_of(mesh))),
                    "dim_b": draw(st.sampled_from(list(range(other_mesh.ndim)) + names_of(other_mesh)))}
            return step("compare", a=handle, b=other, **dims)
        return step("compare", a=handle, b=other)


@operation("root_mesh", "derive", {"src": F.MESH}, ("src",), F.PRODUCES_MESH, weight=1)
class RootMesh:
    """src._get_root_mesh(): the mesh src was sliced, flattened or unflattened from (itself for a root)"""

    def model(run: Any, a: dict) -> Any:
        return run.mesh(a["src"]).root_mesh

    def torch(ex: Any, a: dict) -> Any:
        return root_mesh(ex.mesh(a["src"]))

    def draw(b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return st.just(step("root_mesh", src=handle, out=b.fresh("r")))


@operation("group_count", "query", {}, weight=1)
class GroupCount:
    """how many groups this plan has named so far (torch's _world.group_count, counted from the plan's start;
    every new_group call counts, members or not)"""

    def model(run: Any, a: dict) -> Any:
        return run.model.group_counter

    def torch(ex: Any, a: dict) -> Any:
        import torch.distributed.distributed_c10d as c10d

        return c10d._world.group_count - ex.group_base

    def draw(b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return st.just(step("group_count"))
