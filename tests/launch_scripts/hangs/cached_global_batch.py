"""A (4, 2) mesh, ("dp", "tp"), on 2 hosts x 4. Each step every rank pads its batch to the longest sequence over
dp, which a helper that functools.cache remembers by the local length all_reduces (MAX), sums the padded
activations' partial sums over tp, then gathers the replicas' losses over dp. Sequences grow every step up to a
cap: ranks 6 and 7 (dp coordinate 3) reach it at step 2, so at step 3 the cache serves their length and their
call never reaches the all_reduce; they go on to the tp sum and the loss all_gather while their dp peers wait for
them in the length's. The cause is ranks 6 and 7, whose call the cache swallowed."""
import functools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
dp_rank = mesh.get_local_rank("dp")


@functools.cache
def longest(local: int) -> int:
    length = torch.tensor([local])
    dist.all_reduce(length, op=dist.ReduceOp.MAX, group=dp)
    return int(length.item())


for step in range(4):
    local = min(10 + 7 * step + 5 * dp_rank, 38)
    padded = torch.zeros(2, longest(local))
    padded[:, :local] = 1.0
    dist.all_reduce(padded, group=tp)
    losses = torch.empty(4)
    dist.all_gather_into_tensor(losses, padded.mean().reshape(1), group=dp)
dist.barrier()
