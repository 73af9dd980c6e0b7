"""DTensor: rank 1 takes its local shard where the others redistribute to Replicate (an all_gather on the tp
dim), then every rank all_reduces on the dp dim."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("dp", "tp"))
w = distribute_tensor(torch.arange(16.0, device="cuda").reshape(4, 4), mesh, [Replicate(), Shard(0)])
if dist.get_rank() == 1:
    full = w.to_local()
else:
    full = w.redistribute(mesh, [Replicate(), Replicate()]).to_local()
out = full.sum().reshape(1)
dist.all_reduce(out, group=mesh.get_group("dp"))
print("done", out.item())
