"""Only ranks 0 and 1 call new_group([0, 1]) (the classic mistake: every rank must call it, members or not)."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(2)
if rank in (0, 1):
    pair = dist.new_group([0, 1])
    dist.all_reduce(x, group=pair)
dist.all_reduce(x)
print("done")
