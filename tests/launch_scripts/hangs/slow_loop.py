"""No hang: every rank all_reduces on its tp group and meets in a world barrier, step after step, many more steps
than the deadline lets them finish. Every rank is still completing collectives when the deadline strikes: the run
is too slow for its deadline, and nobody is a culprit."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
tp = mesh.get_group("tp")
x = torch.ones(4, device="cuda")
for _ in range(1_000_000):
    dist.all_reduce(x, group=tp)
    dist.barrier()
print("done")
