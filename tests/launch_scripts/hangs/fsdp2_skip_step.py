"""FSDP2 on a (replicate, shard) mesh: rank 3 skips the forward and backward of step 1 (an empty batch)."""
import os

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("replicate", "shard"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).cuda()
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    if rank == 3 and step == 1:
        continue
    model(torch.randn(4, 8, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
print("trained")
