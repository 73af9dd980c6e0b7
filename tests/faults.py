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
