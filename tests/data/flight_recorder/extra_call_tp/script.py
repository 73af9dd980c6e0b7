"""A (2, 4) mesh (dp, tp): each host's local rank 0 (ranks 0 and 4) makes one extra all_reduce on its tp group
before the tp all_reduce every rank makes; then a barrier. In each tp group three members make one call and one
makes two: the culprits are 0 and 4."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    tp = mesh.get_group("tp")
    x = torch.ones(4)
    if dist.get_rank() % 4 == 0:
        dist.all_reduce(x, group=tp)  # a host-local statistic, left in by mistake
    dist.all_reduce(x, group=tp)
    dist.barrier()


frcase.run(main)
