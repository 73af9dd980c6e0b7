"""A 2 x 2 x 2 (dp, cp, tp) mesh: each of two steps all_reduces on tp, then cp, then dp; rank 6 skips
the cp all_reduce of the second step."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    rank = dist.get_rank()
    grads = torch.ones(4)
    for step in range(2):
        dist.all_reduce(grads, group=mesh.get_group("tp"))
        if not (rank == 6 and step == 1):
            dist.all_reduce(grads, group=mesh.get_group("cp"))
        dist.all_reduce(grads, group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
