"""On 2 hosts x 4, rank 5 (host 1) skips the dp all_reduce of step 1 in a loop that all_reduces on dp and tp."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
x = torch.ones(4, device="cuda")
for step in range(3):
    dist.all_reduce(x, group=mesh.get_group("tp"))
    if not (dist.get_rank() == 5 and step == 1):
        dist.all_reduce(x, group=mesh.get_group("dp"))
print("done")
