"""Data-parallel training on 2 nodes x 4 ranks, as a (node=2, local=4) mesh. Per step:
node-wide loader statistics (mesh["local"]), a replica-consistency checksum between the two ranks
that hold the same slot on both nodes (mesh["node"]), then the gradient all-reduce over the job.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

DEV_PER_HOST = 4
DIM, BATCH, STEPS = 24, 16, 5


def next_batch(rank, step):
    g = torch.Generator().manual_seed(1 + 17 * step + rank)
    x = torch.randn(BATCH, DIM, generator=g)
    if rank == 7 and step == 1:
        x *= 40.0  # an un-normalised shard slipped into the mix
    y = (x[:, 0] > 0).long()
    cached = rank == 2 and step == 1  # the prefetcher replayed its cached batch
    stats = None if cached else torch.tensor([BATCH, float(x.abs().mean()), 0.0, 1.0])
    return x, y, stats


def checksum(model):
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return torch.stack([flat.sum(), flat.abs().sum(), flat.pow(2).sum(), flat.max()])


def main():
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, DEV_PER_HOST), mesh_dim_names=("node", "local"))
    node_g, local_g = mesh["node"].get_group(), mesh["local"].get_group()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y, stats = next_batch(rank, step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        gnorm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
        if gnorm > 10.0:
            # suspicious step: make sure this replica has not drifted from its twin first
            dist.all_reduce(checksum(model), group=node_g)
        if stats is not None:
            dist.all_reduce(stats, group=local_g)
        cs = checksum(model)
        dist.all_reduce(cs, group=node_g)
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(flat)
        off = 0
        for p in model.parameters():
            p.grad.copy_(flat[off:off + p.numel()].view_as(p) / 8)
            off += p.numel()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} gnorm {gnorm.item():.2f}", flush=True)


if __name__ == "__main__":
    frcase.run(main)
