"""DDP with uneven inputs: rank 2 has 2 batches, the others 4; rank 2 finishes its loop and leaves while the
others wait in the gradient all_reduce of their third step."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = 2 if rank == 2 else 4
for _ in range(batches):
    opt.zero_grad()
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
print("trained", batches, "steps")
