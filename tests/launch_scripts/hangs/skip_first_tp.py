"""Rank 1 skips the first all_reduce on the tp dim of a (dp, tp) mesh; its later tp call pairs with rank 0's
first one, and rank 0 ends up waiting for a tp call rank 1 never makes."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("dp", "tp"))
x = torch.ones(8, device="cuda")
if dist.get_rank() != 1:
    dist.all_reduce(x, group=mesh.get_group("tp"))
dist.all_reduce(x, group=mesh.get_group("dp"))
dist.all_reduce(x, group=mesh.get_group("tp"))
print("done", x[0].item())
