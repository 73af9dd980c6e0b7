"""Two bugs at once on 2 hosts x 4: rank 1 skips a tp all_reduce and rank 6 skips a dp all_reduce."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
x = torch.ones(4, device="cuda")
if rank != 1:
    dist.all_reduce(x, group=mesh.get_group("tp"))
if rank != 6:
    dist.all_reduce(x, group=mesh.get_group("dp"))
print("done")
