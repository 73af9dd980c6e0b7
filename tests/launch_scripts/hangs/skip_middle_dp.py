"""Rank 2 skips the second of three gradient all_reduces on the dp dim (a cpu mesh)."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
dp = mesh["dp"].get_group()
grads = [torch.ones(4) for _ in range(3)]
for i, g in enumerate(grads):
    if i == 1 and dist.get_rank() == 2:
        continue
    dist.all_reduce(g, group=dp)
dist.all_reduce(grads[0], group=mesh["tp"].get_group())
print("synced")
