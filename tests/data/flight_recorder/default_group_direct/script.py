"""dist.all_reduce with no group (the default group), three steps; rank 7 skips the second step's,
then every rank meets in a barrier."""

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
    for step in range(3):
        if not (rank == 7 and step == 1):
            dist.all_reduce(grads)
    dist.barrier()


frcase.run(main)
