"""DTensor on a (2, 4) mesh (dp, tp): rank 1 takes its local shard where every other rank redistributes to
Replicate (an all_gather on tp), then every rank all_reduces on dp. The cause is rank 1."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    w = distribute_tensor(torch.arange(16.0).reshape(4, 4), mesh, [Replicate(), Shard(0)])
    if dist.get_rank() == 1:
        full = w.to_local()
    else:
        full = w.redistribute(mesh, [Replicate(), Replicate()]).to_local()
    out = full.sum().reshape(1)
    dist.all_reduce(out, group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
