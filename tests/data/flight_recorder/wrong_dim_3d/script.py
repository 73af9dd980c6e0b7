"""A (2, 2, 2) mesh (pp, dp, tp): rank 5 all_reduces on dp where every other rank all_reduces on tp; then every
rank all_reduces on dp and meets in a barrier. Rank 5's dp partner 7 pairs its own dp all_reduce with that wrong
call; rank 4 waits on tp for rank 5. The cause is rank 5."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    x = torch.ones(4)
    dim = "dp" if dist.get_rank() == 5 else "tp"
    dist.all_reduce(x, group=mesh.get_group(dim))
    dist.all_reduce(x, group=mesh.get_group("dp"))
    dist.barrier()


frcase.run(main)
