"""Rank 5 skips init_device_mesh (a branch only it takes) and goes on to the default group's second
all_reduce. Its dp and tp partners hang inside group creation, which Flight Recorder does not record; ranks
0, 2 and 3 made their groups and wait in tp for rank 1, which waits to make its dp group with rank 5."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    rank = dist.get_rank()
    grads = torch.ones(4)
    dist.all_reduce(grads)
    if rank != 5:
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        dist.all_reduce(grads, group=mesh.get_group("tp"))
    dist.all_reduce(grads)


frcase.run(main)
