"""Rank 1 all_reduces on its tp group first and then on the world; every other rank does the world first: ranks
0 and 1 wait for each other (a true deadlock)."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
tp = mesh.get_group("tp")
x = torch.ones(4)
if dist.get_rank() == 1:
    dist.all_reduce(x, group=tp)
    dist.all_reduce(x)
else:
    dist.all_reduce(x)
    dist.all_reduce(x, group=tp)
print("done")
