"""Rank 2 raises (a bad batch) in the second step, before its tp all_reduce of a 2 x 4 (dp, tp) mesh;
its dump comes from the exception path, written while the others wait for it."""

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
        if rank == 2 and step == 1:
            raise ValueError("bad batch: 17 NaNs in the input")
        dist.all_reduce(grads, group=mesh.get_group("tp"))
        dist.all_reduce(grads, group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
