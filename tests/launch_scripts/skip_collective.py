"""Rank 5 skips the tp all_reduce that every other rank makes: a hang on group [4, 5, 6, 7]."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
x = torch.ones(4, device="cuda")
if dist.get_rank() != 5:
    dist.all_reduce(x, group=mesh.get_group("tp"))
dist.all_reduce(x, group=mesh.get_group("dp"))
print("done", x.tolist())
