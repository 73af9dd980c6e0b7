"""A DDP training loop as GPU scripts write it (nccl, set_device, cuda:LOCAL_RANK, DDP device_ids), run for --steps
steps: the bench's per-step time comes from two step counts."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device), device_ids=[local_rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data, target = torch.randn(32, 64, device=device), torch.randint(0, 10, (32,), device=device)
for _ in range(args.steps):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
if dist.get_rank() == 0:
    print(f"loss after {args.steps} steps {loss.item():.6f}")
dist.destroy_process_group()
