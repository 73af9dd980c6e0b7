"""Bidirectional pipeline over 8 devices (two hosts): pipeline A runs stages 0..7 on ranks 0..7 and
pipeline B runs the mirrored model on ranks 7..0, so every device holds one chunk of each direction
and the bubbles of one direction are filled by the other. Neighbouring devices share a 2-rank link
group; activations and grads cross a link as a broadcast rooted at the sending device."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

STEPS = 5
DIM = 24
MICRO_BATCH = 4
N_STAGES = 8
ORDER = {"A": list(range(N_STAGES)), "B": list(reversed(range(N_STAGES)))}


class Link:
    def __init__(self, lo):
        self.lo, self.hi = lo, lo + 1
        self.group = dist.new_group([self.lo, self.hi])


def main():
    rank = dist.get_rank()
    links = [Link(lo) for lo in range(N_STAGES - 1)]

    def link(a, b):
        return links[min(a, b)]

    def send(t, dst):
        dist.broadcast(t.contiguous(), src=rank, group=link(rank, dst).group)

    def recv(src):
        buf = torch.empty(MICRO_BATCH, DIM)
        dist.broadcast(buf, src=src, group=link(rank, src).group)
        return buf

    stage = {p: ORDER[p].index(rank) for p in ORDER}
    torch.manual_seed(rank)
    chunk = {p: torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.Tanh()) for p in ORDER}
    opt = torch.optim.SGD([w for c in chunk.values() for w in c.parameters()], lr=0.01)
    g = torch.Generator().manual_seed(1234)

    def first_stage_forward(pipe, x):
        out = chunk[pipe](x)
        nxt = link(rank, ORDER[pipe][1])
        dist.broadcast(out.detach(), src=nxt.lo, group=nxt.group)
        return x, out

    def forward(pipe, x):
        s = stage[pipe]
        if s == 0:
            return first_stage_forward(pipe, x)
        act_in = recv(ORDER[pipe][s - 1]).requires_grad_()
        out = chunk[pipe](act_in)
        if s < N_STAGES - 1:
            send(out.detach(), ORDER[pipe][s + 1])
        return act_in, out

    def backward(pipe, act_in, out, target):
        s = stage[pipe]
        if s == N_STAGES - 1:
            F.mse_loss(out, target).backward()
        else:
            out.backward(recv(ORDER[pipe][s + 1]))
        if s > 0:
            send(act_in.grad, ORDER[pipe][s - 1])

    for step in range(STEPS):
        opt.zero_grad()
        batch = {p: torch.randn(MICRO_BATCH, DIM, generator=g) for p in ORDER}
        saved = {p: forward(p, batch[p]) for p in ("A", "B")}
        for p in ("A", "B"):
            backward(p, *saved[p], torch.sin(batch[p]))
        opt.step()
    dist.barrier()


if __name__ == "__main__":
    frcase.run(main)
