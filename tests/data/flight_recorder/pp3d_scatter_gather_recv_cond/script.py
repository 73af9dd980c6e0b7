"""Two-stage pipeline x data parallel x tensor parallel on a 3-D mesh ("pp", "dp", "tp") = (2, 2, 2).

Stage 0 runs on host 0 (ranks 0-3), stage 1 on host 1 (ranks 4-7); rank = pp * 4 + dp * 2 + tp. The
activation between stages is replicated over the tp pair, so only tp rank 0 of each pair sends / receives
it over the pipeline ("scatter-gather" optimisation) and the receiving stage shares it inside the tp pair
with a broadcast. A pipeline link is the 2-rank "pp" group {r, r + 4}, on which the sender broadcasts as
root. Gradients go back the same way. GPipe schedule with 2 microbatches.
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
HIDDEN = 32
MICROBATCHES = 2
MB_SIZE = 8
STEPS = 5


def main():
    rank = dist.get_rank()
    local_rank = rank % DEVICES_PER_HOST
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    stage, dp, tp = (mesh[d].get_local_rank() for d in ("pp", "dp", "tp"))
    tp_group, dp_group, pp_group = mesh.get_group("tp"), mesh.get_group("dp"), mesh.get_group("pp")
    tp_ranks = mesh["tp"].mesh.tolist()
    pp_peer = mesh["pp"].mesh.tolist()[1 - stage]
    half = HIDDEN // 2

    torch.manual_seed(stage)
    w = nn.Parameter(torch.randn(HIDDEN, HIDDEN)[tp * half:(tp + 1) * half] / HIDDEN ** 0.5)  # row shard
    head = nn.Linear(HIDDEN, 1) if stage == 1 else None
    params = [w] + (list(head.parameters()) if head else [])
    opt = torch.optim.SGD(params, lr=0.05)
    gen = torch.Generator().manual_seed(40 + dp)  # both stages and both tp ranks of a replica: same data

    def tp_linear(x):  # column-parallel matmul, outputs gathered over the tp pair
        part = x @ w.t()
        parts = [torch.empty_like(part) for _ in range(2)]
        dist.all_gather(parts, part.detach().contiguous(), group=tp_group)
        parts[tp] = part
        return torch.cat(parts, -1)

    def recv_over_pipeline(shape):
        t = torch.empty(shape)
        if local_rank == 0:  # first device of the pair receives, then shares it with its tp peer
            dist.broadcast(t, src=pp_peer, group=pp_group)
        dist.broadcast(t, src=tp_ranks[0], group=tp_group)
        return t

    def send_over_pipeline(t):
        if tp == 0:
            dist.broadcast(t.contiguous(), src=rank, group=pp_group)

    for step in range(STEPS):
        t0 = time.time()
        xs = torch.randn(MICROBATCHES, MB_SIZE, HIDDEN, generator=gen)
        ys = xs.sum(-1, keepdim=True).tanh()
        ins, outs, losses = [], [], []
        for mb in range(MICROBATCHES):
            if stage == 0:
                x = xs[mb]
                h = torch.relu(tp_linear(x))
                send_over_pipeline(h.detach())
            else:
                x = recv_over_pipeline((MB_SIZE, HIDDEN)).requires_grad_(True)
                h = F.mse_loss(head(torch.relu(tp_linear(x))), ys[mb]) / MICROBATCHES
                losses.append(h.detach())
            ins.append(x)
            outs.append(h)
        for mb in reversed(range(MICROBATCHES)):
            if stage == 1:
                outs[mb].backward()
                g = ins[mb].grad.clone()
                dist.all_reduce(g, group=tp_group)  # each tp rank holds a partial input gradient
                send_over_pipeline(g)
            else:
                g = recv_over_pipeline((MB_SIZE, HIDDEN))
                outs[mb].backward(g)
        for p in params:
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= 2
        opt.step()
        opt.zero_grad()
        total = torch.stack(losses).sum().reshape(1) if stage == 1 else torch.zeros(1)
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step} loss {total.item() / 4:.4f} ({time.time() - t0:.2f}s)", flush=True)
    dist.barrier()


if __name__ == "__main__":
    frcase.run(main)
