"""A (2, 4) mesh (dp, tp) on two hosts: rank 1 skips a tp all_reduce and rank 6 skips a dp all_reduce, then every
rank meets in a barrier. Two culprits, 1 and 6."""
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
    x = torch.ones(4)
    if rank != 1:
        dist.all_reduce(x, group=mesh.get_group("tp"))
    if rank != 6:
        dist.all_reduce(x, group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
