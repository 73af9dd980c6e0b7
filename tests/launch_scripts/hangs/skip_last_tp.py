"""The last rank skips the final all_gather on its tp group and reaches the end of the script."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("dp", "tp"))
tp = mesh.get_group("tp")
x = torch.full((2,), float(dist.get_rank()), device="cuda")
dist.all_reduce(x, group=tp)
dist.all_reduce(x, group=mesh.get_group("dp"))
if dist.get_rank() != world - 1:
    out = [torch.empty_like(x) for _ in range(world // 2)]
    dist.all_gather(out, x, group=tp)
print("bye")
