"""On 2 hosts x 4, rank 6 skips the last tp all_reduce of host 1's group; host 0's ranks have already finished."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
tp = mesh.get_group("tp")
x = torch.ones(4, device="cuda")
for step in range(3):
    if not (dist.get_rank() == 6 and step == 2):
        dist.all_reduce(x, group=tp)
print("done")
