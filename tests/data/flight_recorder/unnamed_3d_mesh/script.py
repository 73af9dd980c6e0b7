"""A 2 x 2 x 2 mesh without dim names (torch names its groups mesh_dim_0, mesh_dim_1, mesh_dim_2): every
rank all_gathers along dim 1 then all_reduces along dim 2, twice, but rank 7 skips the second all_gather."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    mesh = init_device_mesh("cpu", (2, 2, 2))
    rank = dist.get_rank()
    x = torch.ones(3)
    for step in range(2):
        if not (rank == 7 and step == 1):
            dist.all_gather_into_tensor(torch.empty(6), x, group=mesh.get_group(1))
        dist.all_reduce(x, group=mesh.get_group(2))
    dist.barrier()


frcase.run(main)
