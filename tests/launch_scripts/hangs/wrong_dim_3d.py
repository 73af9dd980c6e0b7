"""A (2, 2, 2) mesh (pp, dp, tp): rank 5 all_reduces on dp where every other rank all_reduces on tp, then every
rank all_reduces on dp and meets in a world barrier. Rank 5's dp partner 7 pairs its own dp call with that wrong
one; rank 4 waits on tp for rank 5. The cause is rank 5 alone."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
x = torch.ones(4, device="cuda")
dim = "dp" if dist.get_rank() == 5 else "tp"
dist.all_reduce(x, group=mesh.get_group(dim))
dist.all_reduce(x, group=mesh.get_group("dp"))
dist.barrier()
print("done")
