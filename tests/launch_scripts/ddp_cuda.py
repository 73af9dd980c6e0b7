"""DDP as GPU scripts write it: device_ids=[LOCAL_RANK], model and data moved with .to(device)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl")
torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank)
torch.manual_seed(0)
model = DDP(nn.Linear(4, 2).to(device), device_ids=[local_rank], output_device=local_rank)
loss = model(torch.ones(3, 4, device=device) * (dist.get_rank() + 1)).sum()
loss.backward()
grads = [p.grad.clone() for p in model.parameters()]
dist.barrier()
print("ok", float(grads[0].sum()))
dist.destroy_process_group()
