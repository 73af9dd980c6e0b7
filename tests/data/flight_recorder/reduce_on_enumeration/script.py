"""dist.new_subgroups_by_enumeration([[0, 2, 4, 6], [1, 3, 5, 7]]): three all_reduces on a rank's own group, but
rank 3 reduces (to its group's first rank) where the others all_reduce the second time. The cause is rank 3."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    rank = dist.get_rank()
    mine, _ = dist.new_subgroups_by_enumeration([[0, 2, 4, 6], [1, 3, 5, 7]])
    x = torch.ones(4)
    for step in range(3):
        if rank == 3 and step == 1:
            dist.reduce(x, dst=1, group=mine)
        else:
            dist.all_reduce(x, group=mine)
    dist.barrier()


frcase.run(main)
