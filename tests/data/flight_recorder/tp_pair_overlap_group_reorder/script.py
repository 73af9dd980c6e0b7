"""Tensor parallel pairs with a second communicator per pair for overlapped grad reduction.

Mesh (4, 2) = ("dp", "tp"). Each tp pair also has an "overlap" group (same two ranks, own communicator) on
which the sequence-parallel LayerNorm grads are reduced while the tp all-reduce of the activation grads
runs. A rank whose LayerNorm bucket is ready early launches the overlap reduce first.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402

DEVICES_PER_HOST = 4

STEPS = 5
B, DIM = 4, 16
EARLY_BUCKET = {(3, 1)}  # (rank, step): the LN bucket fills before the activation-grad bucket on this rank


def main():
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
    tp_pg, dp_pg = mesh.get_group("tp"), mesh.get_group("dp")
    overlap_pg, _ = dist.new_subgroups_by_enumeration([[0, 1], [2, 3], [4, 5], [6, 7]])
    torch.manual_seed(0)
    ln = nn.LayerNorm(DIM)
    fc = nn.Linear(DIM, DIM)  # row-parallel shard
    params = list(ln.parameters()) + list(fc.parameters())
    opt = torch.optim.SGD(params, lr=1e-2)
    gen = torch.Generator().manual_seed(mesh["dp"].get_local_rank())
    for step in range(STEPS):
        x = torch.randn(B, DIM, generator=gen)
        opt.zero_grad()
        h = fc(ln(x))
        loss = (h ** 2).mean()
        loss.backward()
        act_grad = h.detach().clone()  # stands in for the activation grads of the tp block
        ln_grads = torch.cat([p.grad.reshape(-1) for p in ln.parameters()])
        if (rank, step) in EARLY_BUCKET:
            dist.all_reduce(ln_grads, group=overlap_pg)
            dist.all_reduce(act_grad, group=tp_pg)
        else:
            dist.all_reduce(act_grad, group=tp_pg)
            dist.all_reduce(ln_grads, group=overlap_pg)
        flat = torch.cat([p.grad.reshape(-1) for p in fc.parameters()])
        dist.all_reduce(flat, group=dp_pg)
        opt.step()
        total = loss.detach().reshape(1)
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step} loss {total.item() / 8:.4f}", flush=True)


if __name__ == "__main__":
    frcase.run(main)
