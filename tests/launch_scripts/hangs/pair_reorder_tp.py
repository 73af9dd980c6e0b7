"""A (4, 2) mesh: on its tp pair [6, 7] rank 6 calls barrier and then all_reduce, while every other rank
(rank 7 and the three sibling tp pairs) calls all_reduce and then barrier. The pair alone cannot say which of its
two members departs; its siblings can: rank 6."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (4, 2), mesh_dim_names=("dp", "tp"))
tp = mesh.get_group("tp")
x = torch.ones(4, device="cuda")
if dist.get_rank() == 6:
    dist.barrier(group=tp)
    dist.all_reduce(x, group=tp)
else:
    dist.all_reduce(x, group=tp)
    dist.barrier(group=tp)
print("done")
