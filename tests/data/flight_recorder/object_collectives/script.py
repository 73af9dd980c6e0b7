"""all_gather_object and broadcast_object_list on the default group, which torch makes of hidden
collectives (sizes, then bytes); rank 4 skips the broadcast_object_list of the second step."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    rank = dist.get_rank()
    for step in range(2):
        stats = [None] * dist.get_world_size()
        dist.all_gather_object(stats, {"rank": rank, "step": step})
        if not (rank == 4 and step == 1):
            config = [{"lr": 0.1, "step": step}] if rank == 0 else [None]
            dist.broadcast_object_list(config, src=0)
    dist.barrier()


frcase.run(main)
