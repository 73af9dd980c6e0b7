"""What meshsim calls in torch that a release lacks or spells otherwise, each in one function that knows the
releases (meshsim.core.releases). The plan interpreter and the ops' torch parts call these, never the private
name itself."""

from __future__ import annotations

from typing import Any


def root_mesh_dim(mesh: Any) -> int | None:
    """Where a 1-D mesh's dim sits in its root: DeviceMesh._get_root_mesh_dim() (2.10+), or the mesh resources'
    get_root_mesh_dim (2.9)."""
    method = getattr(mesh, "_get_root_mesh_dim", None)
    if method is not None:
        return method()
    from torch.distributed.device_mesh import _mesh_resources

    return _mesh_resources.get_root_mesh_dim(mesh)


def clear_sharding_decisions() -> None:
    """Forget DTensor's memoized sharding decisions: an lru_cache with cache_clear (2.10+), or 2.9's
    LocalLRUCache, a thread-local holder of one (`.cache`)."""
    from torch.distributed.tensor import DTensor

    cached = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding
    clear = getattr(cached, "cache_clear", None) or cached.cache.cache_clear
    clear()


def clear_redistribute_plans() -> None:
    """Forget DTensor's cached redistribute plans (2.10+; 2.9 caches none)."""
    from torch.distributed.tensor import _redistribute

    clear = getattr(_redistribute, "clear_redistribute_planner_cache", None)
    if clear is not None:
        clear()


def root_mesh(mesh: Any) -> Any:
    """The mesh `mesh` was sliced, flattened or unflattened from (itself for a root)."""
    method = getattr(mesh, "_get_root_mesh", None)
    if method is not None:
        return method()
    from torch.distributed.device_mesh import _mesh_resources

    return _mesh_resources.get_root_mesh(mesh)


def mesh_dim_by_name(mesh: Any, name: Any) -> int:
    method = getattr(mesh, "_get_mesh_dim_by_name", None)
    if method is not None:
        return method(name)
    from torch.distributed.device_mesh import _mesh_resources

    return _mesh_resources.get_mesh_dim_by_name(mesh, name)


def forget_meshes(meshes: list[Any]) -> None:
    """Drop what keeps a plan's meshes (and their gloo groups, threads and fds) alive after it: each root's
    flattened meshes and group registry (a reference cycle, 2.10+), or the thread's mesh bookkeeping (2.9 keeps
    every mesh ever derived in module state)."""
    from torch.distributed import device_mesh

    for mesh in meshes:
        root = root_mesh(mesh)
        for attr in ("_flatten_mapping", "_pg_registry"):
            getattr(root, attr, {}).clear()
    resources = getattr(device_mesh, "_mesh_resources", None)
    for attr in ("child_to_root_mapping", "root_to_flatten_mapping", "flatten_name_to_root_dims"):
        getattr(resources, attr, {}).clear()
