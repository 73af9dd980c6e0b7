"""On 2 hosts x 4, each host's local rank 0 (ranks 0 and 4) makes one extra all_reduce on its tp group before
the tp all_reduce every rank makes; then every rank enters a world barrier. In each tp group three members make
one call and one makes two: ranks 0 and 4 are the culprits, not the six that ran the common program."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
tp = mesh.get_group("tp")
x = torch.ones(4, device="cuda")
if int(os.environ["LOCAL_RANK"]) == 0:
    dist.all_reduce(x, group=tp)  # a host-local statistic, left in by mistake
dist.all_reduce(x, group=tp)
dist.barrier()
print("done")
