"""Rank 3 thinks it is not part of model parallelism and skips init_device_mesh; the others wait to create the
mesh's groups (every rank must take part in a group's creation)."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if rank != 3:
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
x = torch.ones(2)
dist.all_reduce(x)
print("done")
