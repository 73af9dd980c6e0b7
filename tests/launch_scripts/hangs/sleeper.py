"""Rank 2 sleeps far past the deadline before the all_reduce the others wait in (a straggler)."""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(4)
dist.all_reduce(x)
if dist.get_rank() == 2:
    time.sleep(600)
dist.all_reduce(x)
