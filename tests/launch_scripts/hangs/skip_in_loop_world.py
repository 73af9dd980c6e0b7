"""Rank 1 skips the first of two all_reduces in the second step of a loop on the world group; its later calls
pair with the others' mismatched ones (other sizes) until they wait for a call it never makes."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x, y = torch.ones(2), torch.ones(3)
for step in range(3):
    if not (rank == 1 and step == 1):
        dist.all_reduce(x)
    dist.all_reduce(y)
print("finished", rank)
