"""16 ranks as 2 hosts x 8 (dp, tp): rank 11 skips the tp all_reduce of the second of two steps."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    mesh = init_device_mesh("cpu", (2, 8), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    grads = torch.ones(4)
    for step in range(2):
        if not (rank == 11 and step == 1):
            dist.all_reduce(grads, group=mesh.get_group("tp"))
        dist.all_reduce(grads, group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
