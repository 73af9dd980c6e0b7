"""DDP: rank 1 skips backward at step 2 (its batch was filtered out), so its gradient all_reduce never comes."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    loss = model(torch.randn(2, 8)).sum()
    if rank == 1 and step == 2:
        continue
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained")
