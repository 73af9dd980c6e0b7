"""A (4, 2) mesh (dp, tp): on its tp pair [6, 7] rank 6 calls barrier and then all_reduce, while every other rank
calls all_reduce and then barrier on its tp pair. The pair alone cannot say which member departs; its three sibling
pairs can: rank 6."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh.get_group("tp")
    x = torch.ones(4)
    if dist.get_rank() == 6:
        dist.barrier(group=tp)
        dist.all_reduce(x, group=tp)
    else:
        dist.all_reduce(x, group=tp)
        dist.barrier(group=tp)
    dist.barrier()


frcase.run(main)
