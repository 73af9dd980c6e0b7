"""Rank 3 passes 8 elements to the tp all_reduce of the second step, where its tp peers pass 4
(a 2 x 4 (dp, tp) mesh)."""

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
    for step in range(2):
        grads = torch.ones(8 if rank == 3 and step == 1 else 4)
        dist.all_reduce(grads, group=mesh.get_group("tp"))
        dist.all_reduce(grads[:4].contiguous(), group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
