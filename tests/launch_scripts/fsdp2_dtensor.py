"""FSDP2 and DTensor on a "cuda" mesh of simulated GPUs, with the arithmetic checked."""
import os
import sys

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("replicate", "shard"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).cuda()
fully_shard(model, mesh=mesh)
loss = model(torch.randn(4, 8, device="cuda")).sum()
loss.backward()
full = torch.arange(16.0, device="cuda").reshape(4, 4)
dt = distribute_tensor(full, mesh, [Replicate(), Shard(0)])
assert dt.to_local().shape == (2, 4), dt.to_local().shape
assert torch.equal(dt.full_tensor(), full)
print("ok", sys.argv[1:])
