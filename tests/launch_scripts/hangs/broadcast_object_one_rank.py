"""Rank 0 broadcasts its config with broadcast_object_list, which only it calls; the others go on to the
all_reduce of the first step."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
config = [{"lr": 0.1}] if dist.get_rank() == 0 else [None]
if dist.get_rank() == 0:
    dist.broadcast_object_list(config, src=0)
x = torch.ones(8)
for _ in range(2):
    dist.all_reduce(x)
print("done", config)
