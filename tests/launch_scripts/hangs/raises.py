"""Rank 3 raises (uncaught) in its second step while the others wait in the all_reduce."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(4)
for step in range(3):
    if step == 1 and dist.get_rank() == 3:
        raise RuntimeError("loss exploded on rank 3")
    dist.all_reduce(x)
