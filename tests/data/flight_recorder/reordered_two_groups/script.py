"""Two groups over all 8 ranks made with new_group and a description each (grad_sync, metrics).
Every rank all_reduces on grad_sync then on metrics, twice, but ranks 2 and 5 take the second step's two
calls in the other order: a cycle, each side waiting in the group the other has not reached."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    rank = dist.get_rank()
    grad_sync = dist.new_group(list(range(8)), group_desc="grad_sync")
    metrics = dist.new_group(list(range(8)), group_desc="metrics")
    grads, loss = torch.ones(8), torch.ones(1)
    for step in range(2):
        if rank in (2, 5) and step == 1:
            dist.all_reduce(loss, group=metrics)
            dist.all_reduce(grads, group=grad_sync)
        else:
            dist.all_reduce(grads, group=grad_sync)
            dist.all_reduce(loss, group=metrics)
    dist.barrier()


frcase.run(main)
