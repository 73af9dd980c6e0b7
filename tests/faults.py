"""Bugs injected into DeviceMesh inside the workers, to prove the checks catch them.

Each is a function every rank runs once after joining (Cluster(setup=...) / `meshsim ... --setup faults:NAME`).
"""


def wrong_local_rank():
    """get_local_rank answers for dim 0, whatever dim it is asked about."""
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.get_local_rank
    DeviceMesh.get_local_rank = lambda self, mesh_dim=None: original(self, 0 if self.ndim > 1 else mesh_dim)


def slices_lose_a_rank():
    """Slicing returns a mesh whose coordinate is off by one on the last rank of every slice."""
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.get_coordinate

    def get_coordinate(self):
        coordinate = original(self)
        if coordinate is not None and self._root_mesh is not None and coordinate[-1] == self.shape[-1] - 1:
            return tuple(coordinate[:-1]) + (0,)
        return coordinate

    DeviceMesh.get_coordinate = get_coordinate


def current_mesh_is_outermost():
    """`with mesh:` nested: the current mesh DTensor's APIs take is the outermost, not the innermost."""
    from torch.distributed import device_mesh

    type(device_mesh._mesh_resources).get_current_mesh = lambda self: self.mesh_stack[0]


# ------------------------------------------------------------------------------------------ DTensor
# Bugs of the kinds a random walk missed in 0.2 (issue 25): each touches one cell of the redistribute matrix or
# one kind of derived mesh, and a default sweep must catch it.


def outer_shard_to_shard_flipped():
    """Shard(a) -> Shard(b) on the outer dim of an n-D mesh returns its block reversed along the new dim."""
    import torch
    from torch.distributed.tensor.placement_types import Shard

    original = Shard._to_new_shard_dim

    def to_new_shard_dim(self, local_tensor, mesh, mesh_dim, current_logical_shape, new_shard_dim):
        out = original(self, local_tensor, mesh, mesh_dim, current_logical_shape, new_shard_dim)
        return torch.flip(out, [new_shard_dim]) if mesh.ndim > 1 and mesh_dim == 0 else out

    Shard._to_new_shard_dim = to_new_shard_dim


def partials_reduced_on_one_dim():
    """A DTensor with several Partial dims is reduced twice over the first of them, never over the others."""
    from torch.distributed.tensor import _redistribute
    from torch.distributed.tensor.placement_types import Partial

    state = {"several": False}
    original_redistribute = _redistribute.redistribute_local_tensor
    original_reduce = Partial._reduce_value

    def redistribute_local_tensor(local_tensor, current_spec, target_spec, **kwargs):
        state["several"] = sum(p.is_partial() for p in current_spec.placements) > 1
        try:
            return original_redistribute(local_tensor, current_spec, target_spec, **kwargs)
        finally:
            state["several"] = False

    def reduce_value(self, tensor, mesh, mesh_dim):
        return original_reduce(self, tensor, mesh, 0 if state["several"] else mesh_dim)

    _redistribute.redistribute_local_tensor = redistribute_local_tensor
    Partial._reduce_value = reduce_value


def outer_reduce_scatter_rolled():
    """Partial -> Shard on the outer dim of an n-D mesh hands each rank its neighbour's chunk."""
    import torch
    from torch.distributed.tensor.placement_types import Shard

    original = Shard._reduce_shard_tensor

    def reduce_shard_tensor(self, tensor, mesh, reduce_op, mesh_dim):
        out = original(self, tensor, mesh, reduce_op, mesh_dim)
        if mesh.ndim > 1 and mesh_dim == 0 and out.numel():
            return torch.roll(out, 1, self.dim)
        return out

    Shard._reduce_shard_tensor = reduce_shard_tensor


def uneven_gather_drops_last():
    """Shard -> Replicate of an uneven shard on an inner dim gathers with the last row zeroed."""
    from torch.distributed.tensor.placement_types import Shard

    original = Shard._to_replicate_tensor

    def to_replicate_tensor(self, local_tensor, mesh, mesh_dim, current_logical_shape):
        out = original(self, local_tensor, mesh, mesh_dim, current_logical_shape)
        size = current_logical_shape[self.dim]
        if mesh_dim > 0 and size % mesh.size(mesh_dim) and out.numel():
            out = out.clone()
            out.narrow(self.dim, size - 1, 1).zero_()
        return out

    Shard._to_replicate_tensor = to_replicate_tensor


def concatenate_reverses_dims():
    """DeviceMesh._concatenate of two submeshes returns them in the opposite order."""
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh._concatenate

    def concatenate(device_mesh_list):
        return original(list(device_mesh_list)[::-1]) if len(device_mesh_list) == 2 else original(device_mesh_list)

    DeviceMesh._concatenate = staticmethod(concatenate)


def unflatten_swaps_sizes():
    """DeviceMesh._unflatten lays the new dims out in the opposite order (names kept)."""
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh._unflatten

    def unflatten(self, dim, mesh_sizes, mesh_dim_names, backend_override=None):
        sizes = tuple(mesh_sizes)
        if len(sizes) == 2 and sizes[0] != sizes[1]:
            sizes = sizes[::-1]
        return original(self, dim, sizes, mesh_dim_names, backend_override=backend_override)

    DeviceMesh._unflatten = unflatten


def rank_3_stalls_in_all_gather():
    """Rank 3 never returns from an all_gather: every plan that gathers hangs (for the shrink-budget checks)."""
    import time

    import torch.distributed as dist

    if dist.get_rank() != 3:
        return
    original = dist.all_gather

    def all_gather(*args, **kwargs):
        time.sleep(3600)
        return original(*args, **kwargs)

    dist.all_gather = all_gather


def shard_to_replicate_gathers_twice():
    """Shard -> Replicate all_gathers twice (a wasted collective: values right, the collectives a step issues
    wrong; the fake tier sees it through CommDebugMode)."""
    from torch.distributed.tensor.placement_types import Shard

    original = Shard._to_replicate_tensor

    def to_replicate_tensor(self, local_tensor, mesh, mesh_dim, current_logical_shape):
        original(self, local_tensor, mesh, mesh_dim, current_logical_shape)
        return original(self, local_tensor, mesh, mesh_dim, current_logical_shape)

    Shard._to_replicate_tensor = to_replicate_tensor
