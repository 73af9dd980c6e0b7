"""Rank 1 skips the first all_reduce of the second step of a loop; its later calls pair with rank 0's mismatched
ones until rank 0 waits for a call rank 1 never makes (rank 1 has finished)."""
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
