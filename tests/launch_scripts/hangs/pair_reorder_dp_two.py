"""A (2, 4) mesh: ranks 1 and 2 each call barrier and then all_reduce on their dp pair ([1, 5] and [2, 6]), while
every other rank calls all_reduce and then barrier there. Two culprits, each in a pair that alone cannot decide:
ranks 1 and 2, not their partners 5 and 6."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
dp = mesh.get_group("dp")
x = torch.ones(4, device="cuda")
dist.all_reduce(x, group=mesh.get_group("tp"))
if dist.get_rank() in (1, 2):
    dist.barrier(group=dp)
    dist.all_reduce(x, group=dp)
else:
    dist.all_reduce(x, group=dp)
    dist.barrier(group=dp)
print("done")
