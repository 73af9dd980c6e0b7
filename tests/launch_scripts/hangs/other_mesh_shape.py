"""Rank 0 reads a stale config and builds a (1, world) mesh; every other rank builds (2, world / 2)."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
world = int(os.environ["WORLD_SIZE"])
dp = 1 if int(os.environ["RANK"]) == 0 else 2
mesh = init_device_mesh("cuda", (dp, world // dp), mesh_dim_names=("dp", "tp"))
x = torch.ones(2, device="cuda")
dist.all_reduce(x, group=mesh.get_group("tp"))
print("done")
