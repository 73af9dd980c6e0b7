"""Vision-language adapter training in two 4-stage pipelines (one per host), mesh ("dp", "pp") = (2, 4).

Stage 0: patch embedding, stage 1: vision block, stage 2: the projector (vision -> text width, with its own
hand-written backward that also applies the projector's gradient scaling), stage 3: text block + loss.
Neighbouring stages talk over 2-rank "link" groups {stage, stage + 1} built with new_group; the sender is
the broadcast root. GPipe schedule: all forwards, then all backwards; then the two pipelines average their
gradients over "dp".
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

DEVICES_PER_HOST = 4
WIDTH = 32
PATCH = 24
MICROBATCHES = 4
MB_SIZE = 8
PROJ_GRAD_SCALE = 0.5
STEPS = 5


def main():
    rank = dist.get_rank()
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // DEVICES_PER_HOST, DEVICES_PER_HOST), mesh_dim_names=("dp", "pp"))
    stage = mesh["pp"].get_local_rank()
    dp = mesh["dp"].get_local_rank()
    pp_ranks = mesh["pp"].mesh.tolist()
    n_stages = len(pp_ranks)
    links = {}
    for row in mesh.mesh.tolist():  # every rank creates every link group, in the same order
        for s in range(n_stages - 1):
            g = dist.new_group([row[s], row[s + 1]])
            if rank in (row[s], row[s + 1]):
                links[s] = g

    torch.manual_seed(stage)
    layer = {0: nn.Linear(PATCH, WIDTH), 1: nn.Linear(WIDTH, WIDTH), 2: nn.Linear(WIDTH, WIDTH),
             3: nn.Linear(WIDTH, 10)}[stage]
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(11 + dp)

    def recv_fwd():
        x = torch.empty(MB_SIZE, WIDTH)
        dist.broadcast(x, src=pp_ranks[stage - 1], group=links[stage - 1])
        return x.requires_grad_(True)

    def send_fwd(y):
        dist.broadcast(y.detach().contiguous(), src=rank, group=links[stage])

    def recv_bwd():
        g = torch.empty(MB_SIZE, WIDTH)
        dist.broadcast(g, src=pp_ranks[stage + 1], group=links[stage])
        return g

    def send_bwd(g):
        dist.broadcast(g.contiguous(), src=rank, group=links[stage - 1])

    def projector_backward(x, y):
        g = recv_bwd()
        y.backward(g * PROJ_GRAD_SCALE)
        dist.broadcast(x.grad.contiguous(), src=rank, group=links[stage])

    for step in range(STEPS):
        t0 = time.time()
        patches = torch.randn(MICROBATCHES, MB_SIZE, PATCH, generator=gen)
        labels = torch.randint(0, 10, (MICROBATCHES, MB_SIZE), generator=gen)
        ins, outs, losses = [], [], []
        for mb in range(MICROBATCHES):
            x = patches[mb] if stage == 0 else recv_fwd()
            y = torch.tanh(layer(x)) if stage < n_stages - 1 else layer(x)
            if stage == n_stages - 1:
                y = F.cross_entropy(y, labels[mb]) / MICROBATCHES
                losses.append(y.detach())
            else:
                send_fwd(y)
            ins.append(x)
            outs.append(y)
        for mb in reversed(range(MICROBATCHES)):
            if stage == n_stages - 1:
                outs[mb].backward()
                send_bwd(ins[mb].grad)
            elif stage == 2:
                projector_backward(ins[mb], outs[mb])
            else:
                outs[mb].backward(recv_bwd())
                if stage > 0:
                    send_bwd(ins[mb].grad)
        for p in layer.parameters():
            dist.all_reduce(p.grad, group=mesh.get_group("dp"))
            p.grad /= 2
        opt.step()
        opt.zero_grad()
        total = torch.stack(losses).sum().reshape(1) if losses else torch.zeros(1)
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step} loss {total.item() / 2:.4f} ({time.time() - t0:.2f}s)", flush=True)
    dist.barrier()


if __name__ == "__main__":
    frcase.run(main)
