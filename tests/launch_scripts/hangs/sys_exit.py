"""Rank 3 calls sys.exit(0) in the middle of training, while the others go on to all_reduce on the tp dim."""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
x = torch.ones(4)
for step in range(3):
    dist.all_reduce(x, group=mesh.get_group("tp"))
    if step == 1 and dist.get_rank() == 3:
        sys.exit(0)
print("done")
