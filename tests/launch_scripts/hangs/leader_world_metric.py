"""A (4, 2) mesh (dp, tp) trains two steps: tp all_reduce of the activations, then dp all_reduce of the gradients.
After the first step the ranks with local rank 2 (ranks 2 and 6) log a metric with an all_reduce on the world,
where the dp group was meant; nobody else makes it. Their tp partners 3 and 7 wait for them in the next tp
all_reduce, and the other dp members wait behind those: a cycle whose cause is the one call ranks 2 and 6 added."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
x = torch.ones(4)
for step in range(2):
    dist.all_reduce(x, group=mesh.get_group("tp"))
    dist.all_reduce(x, group=mesh.get_group("dp"))
    if step == 0 and int(os.environ["LOCAL_RANK"]) == 2:
        metric = x.sum().reshape(1)
        dist.all_reduce(metric)
print("done")
