"""Ten steps of all_reduce on tp then dp of a 2 x 4 (dp, tp) mesh with a Flight Recorder of only 6 entries
a rank: rank 6 skips the tp all_reduce of step 7, and every rank's oldest calls have fallen out of its
buffer by the time the job hangs."""

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
    grads = torch.ones(4)
    for step in range(10):
        if not (rank == 6 and step == 7):
            dist.all_reduce(grads, group=mesh.get_group("tp"))
        dist.all_reduce(grads, group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
