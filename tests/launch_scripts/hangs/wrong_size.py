"""Rank 1 all_reduces a tensor of another size than the others (a shape bug) in a loop."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
n = 5 if dist.get_rank() == 1 else 1000
x = torch.ones(n)
for _ in range(4):
    dist.all_reduce(x)
dist.barrier()
print("done")
