"""Rank 3 stalls (a sleep far longer than the job's patience) before the second step's all_reduce on its
tp group of a 2 x 4 (dp, tp) mesh; everyone else goes on and waits for it."""

import os
import sys
import time

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
        if rank == 3 and step == 1:
            time.sleep(600)
        dist.all_reduce(grads, group=mesh.get_group("tp"))
        dist.all_reduce(grads, group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
