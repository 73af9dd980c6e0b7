"""dist.new_subgroups(4) makes groups 0-3 and 4-7 (no description); each rank all_reduces on its own
three times, but rank 1 skips the second, so its third meets its peers' second, and they wait in their
third while rank 1 is in the closing barrier."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    rank = dist.get_rank()
    mine, _ = dist.new_subgroups(4)
    grads = torch.ones(4)
    for step in range(3):
        if not (rank == 1 and step == 1):
            dist.all_reduce(grads, group=mine)
    dist.barrier()


frcase.run(main)
