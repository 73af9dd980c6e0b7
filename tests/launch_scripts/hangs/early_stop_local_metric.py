"""A (2, 4) mesh (dp, tp) trains in a loop: each step all_reduces the activations' norm on tp, then the loss on dp.
The stopping test reads the rank's own validation metric, before any reduction: rank 6's crosses the threshold at
step 2, so it leaves the loop and goes on to the final checkpoint all_reduce on the world while every other rank
runs step 2. Rank 6's tp peers wait for it on tp [4, 5, 6, 7]; everyone else is held up behind them. The cause is
rank 6 alone: it skipped step 2's tp all_reduce."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
metric = 1.0
for _step in range(5):
    metric *= 0.5 if rank == 6 else 0.9
    if metric < 0.2:  # the bug: a decision every rank must take together, taken on one rank's own number
        break
    norm = torch.ones(1)
    dist.all_reduce(norm, group=mesh.get_group("tp"))
    loss = torch.full((1,), metric)
    dist.all_reduce(loss, group=mesh.get_group("dp"))
state = torch.ones(4)
dist.all_reduce(state)
print("saved")
