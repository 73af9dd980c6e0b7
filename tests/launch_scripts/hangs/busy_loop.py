"""Rank 1 spins in a pure Python loop (a bug in its data pipeline) while the others wait in a barrier."""
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    n = 0
    while n >= 0:
        n += 1
dist.barrier()
