"""Rank 6 runs out of data after one step and leaves (exit code 0, as an uneven data loader makes it),
while the others go on to the second step of all_reduces on the tp and dp dims of a 2 x 4 mesh."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    grads = torch.ones(4)
    for step in range(2):
        if rank == 6 and step == 1:
            os._exit(0)
        dist.all_reduce(grads, group=mesh.get_group("tp"))
        dist.all_reduce(grads, group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
