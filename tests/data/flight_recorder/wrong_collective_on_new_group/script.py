"""Two hand-made groups, ranks 0-3 and 4-7 (dist.new_group, no DeviceMesh). Each rank all_reduces on its
group twice, but rank 2 broadcasts where its group's second all_reduce is."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import frcase  # noqa: E402


def main():
    rank = dist.get_rank()
    low, high = dist.new_group([0, 1, 2, 3]), dist.new_group([4, 5, 6, 7])
    group = low if rank < 4 else high
    grads = torch.ones(16)
    dist.all_reduce(grads, group=group)
    if rank == 2:
        dist.broadcast(grads, src=0, group=group)
    else:
        dist.all_reduce(grads, group=group)
    dist.barrier()


frcase.run(main)
