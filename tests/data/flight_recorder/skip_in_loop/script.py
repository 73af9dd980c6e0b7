"""In a loop of three steps (all_reduce, then reduce_scatter, on the dp dim of a 2 x 4 mesh), rank 1 skips
the all_reduce of the second step. gloo pairs its reduce_scatter with its partner rank 5's all_reduce and
both complete (the two exchange the same bytes on two ranks), and so on, shifted by one, until rank 5's last
reduce_scatter waits for a rank that has gone on to the final barrier."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    dp = mesh.get_group("dp")
    grads, shard = torch.ones(8), torch.empty(4)
    for step in range(3):
        if not (rank == 1 and step == 1):
            dist.all_reduce(grads, group=dp)
        dist.reduce_scatter_tensor(shard, grads, group=dp)
    dist.barrier()


frcase.run(main)
