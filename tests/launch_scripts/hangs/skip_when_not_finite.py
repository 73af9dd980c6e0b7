"""A training loop that skips the gradient all_reduce when its loss is not finite: rank 2's loss is inf at step 2
(data-dependent), so rank 2 skips one all_reduce on the dp dim."""
import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
grad = torch.zeros(16)
for step in range(4):
    loss = math.inf if (rank == 2 and step == 2) else 1.0 / (step + 1)
    grad.fill_(loss)
    if math.isfinite(loss):
        dist.all_reduce(grad, group=mesh.get_group("dp"))
    dist.all_reduce(grad, group=mesh.get_group("tp"))
print("trained")
