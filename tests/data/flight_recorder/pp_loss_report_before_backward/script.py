"""4-stage pipeline per replica on the 'pp' dim of a (dp=2, pp=4) mesh. Stages are linked by 2-rank
process groups (activations: broadcast from the earlier stage; gradients: broadcast from the later one),
two microbatches per step (all forwards, then all backwards). Stage 0 owns the logger: the last stage
reports the step's loss to it over a (last, first) link."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

DEVICES_PER_HOST = 4
DIM, MB, N_MICRO, STEPS = 32, 4, 2, 5


def main():
    rank = dist.get_rank()
    n_rep = dist.get_world_size() // DEVICES_PER_HOST
    mesh = init_device_mesh("cpu", (n_rep, DEVICES_PER_HOST), mesh_dim_names=("dp", "pp"))
    dp_group = mesh.get_group("dp")
    stage, n_stages = mesh.get_local_rank("pp"), mesh.size(1)
    links, report_link = {}, None
    for rep in range(n_rep):  # every rank creates every group, in the same order
        ranks = [rep * DEVICES_PER_HOST + s for s in range(n_stages)]
        for s in range(n_stages - 1):
            g = dist.new_group([ranks[s], ranks[s + 1]])
            if rank in (ranks[s], ranks[s + 1]):
                links[s] = g
        g = dist.new_group([ranks[0], ranks[-1]])
        if rank in (ranks[0], ranks[-1]):
            report_link = g
    base = mesh.get_local_rank("dp") * DEVICES_PER_HOST
    first, last = base, base + n_stages - 1
    torch.manual_seed(stage)
    layer = nn.Sequential(nn.Linear(DIM, DIM), nn.SiLU(), nn.Linear(DIM, DIM))
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(mesh.get_local_rank("dp"))

    for step in range(STEPS):
        xs, ys, losses = [], [], []
        for _ in range(N_MICRO):
            if stage == 0:
                x = torch.randn(MB, DIM, generator=data)
            else:
                x = torch.empty(MB, DIM)
                dist.broadcast(x, src=base + stage - 1, group=links[stage - 1])
                x.requires_grad_()
            y = layer(x)
            if stage < n_stages - 1:
                dist.broadcast(y.detach(), src=rank, group=links[stage])
            else:
                losses.append(y.pow(2).mean())
            xs.append(x)
            ys.append(y)
        if rank == last:
            report = torch.stack([l.detach() for l in losses]).mean().reshape(1)
            dist.broadcast(report, src=last, group=report_link)
        for mb in reversed(range(N_MICRO)):
            if stage == n_stages - 1:
                losses[mb].backward()
            else:
                g = torch.empty(MB, DIM)
                dist.broadcast(g, src=base + stage + 1, group=links[stage])
                ys[mb].backward(g)
            if stage > 0:
                dist.broadcast(xs[mb].grad, src=rank, group=links[stage - 1])
        for p in layer.parameters():
            dist.all_reduce(p.grad, group=dp_group)
        opt.step()
        opt.zero_grad()
        if rank == first:
            report = torch.empty(1)
            dist.broadcast(report, src=last, group=report_link)
            print(f"rank {rank} step {step} loss {report.item():.4f}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    frcase.run(main)
