"""Rank 3 returns from the script before the last all_reduce that every other rank makes."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(1)
dist.all_reduce(x)
if dist.get_rank() == 3:
    sys.exit(0)
dist.all_reduce(x)
