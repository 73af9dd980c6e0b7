"""DDP over a flat 8-way mesh; every rank reads a contiguous slice of the sample index.

Held out (written blind, outside meshsim's tests, 2026-11-27; missed blind: the metrics group and the mesh's dp
dim are two groups of the same eight ranks, which the symmetry rule took for one, and ranks 1 and 3, held inside
DDP's own bucket-rebuild broadcast (C++, unseen), were named stragglers):
ddp_contiguous_shards [7]. The contiguous, unpadded shard gives rank 7 two samples (one batch) where the others get
four (two batches): it leaves the DDP loop a step early and waits in the epoch-end all_reduce on the metrics group
while the others wait for it in their second step's gradient all_reduce.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

NUM_SAMPLES = 30
BATCH = 2


def shard_indices(rank, world):
    per_rank = math.ceil(NUM_SAMPLES / world)
    start = rank * per_rank
    return list(range(start, min(start + per_rank, NUM_SAMPLES)))


def batches(indices):
    for i in range(0, len(indices), BATCH):
        idx = torch.tensor(indices[i:i + BATCH], dtype=torch.float32)
        yield idx.unsqueeze(1).repeat(1, 16) / NUM_SAMPLES


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    rank = mesh.get_local_rank("dp")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)),
                process_group=mesh.get_group("dp"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics_group = dist.new_group(backend="gloo")  # host-side group for counters and logging

    for epoch in range(2):
        seen = 0
        for x in batches(shard_indices(rank, mesh.size())):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            seen += x.shape[0]
        total = torch.tensor([float(seen)])
        dist.all_reduce(total, group=metrics_group)
        if rank == 0:
            print(f"epoch {epoch}: {int(total.item())} samples", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
