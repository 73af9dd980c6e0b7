"""A (2, 4) mesh: two steps of tp then dp all_reduce, then rank 1 alone makes one more all_reduce on its dp pair
[1, 5] (an evaluation step under `if rank == 1`). Rank 5 finished the program every rank ran; rank 1 added the
call."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
dp = mesh.get_group("dp")
x = torch.ones(4, device="cuda")
for _ in range(2):
    dist.all_reduce(x, group=mesh.get_group("tp"))
    dist.all_reduce(x, group=dp)
if dist.get_rank() == 1:
    dist.all_reduce(x, group=dp)
print("done")
