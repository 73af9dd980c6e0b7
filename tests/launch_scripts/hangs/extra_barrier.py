"""Rank 0 saves a checkpoint and calls a barrier that only it makes (mis-indented under `if rank == 0`)."""
import os
import tempfile

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(3):
    dist.all_reduce(x)
    if rank == 0 and step == 1:
        torch.save(x, os.path.join(tempfile.gettempdir(), f"ckpt-{os.getpid()}.pt"))
        dist.barrier()
print("done")
