"""Rank 3 broadcasts where every other rank all_reduces, then all of them all_reduce again."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(4)
if dist.get_rank() == 3:
    dist.broadcast(x, src=0)
else:
    dist.all_reduce(x)
for _ in range(3):
    dist.all_reduce(x)
print("done", x.tolist())
