"""8-stage pipeline over both hosts (1-D mesh of 8), one stage per rank; the activations and grads go over
2-rank link groups (dist.new_group([s, s + 1])) as broadcasts from the sender. Each step: forward 0 -> 7,
loss on stage 7, backward 7 -> 0, then a global grad-norm all-reduce. Stage 5 is a cross-attention stage
with its own link methods.
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


class Stage(nn.Module):
    """One pipeline stage: its block and its links. links[s] is the 2-rank group of stages s and s + 1;
    a tensor goes over a link as a broadcast from its sender."""

    def __init__(self, rank, n, links):
        super().__init__()
        self.rank, self.n, self.links = rank, n, links
        self.block = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh())

    def forward(self, x):
        return self.block(x)

    def recv_activation(self, buf):
        dist.broadcast(buf, src=self.rank - 1, group=self.links[self.rank - 1])

    def send_activation(self, out):
        dist.broadcast(out, src=self.rank, group=self.links[self.rank])

    def recv_grad(self, buf):
        dist.broadcast(buf, src=self.rank + 1, group=self.links[self.rank])

    def send_grad(self, grad):
        dist.broadcast(grad, src=self.rank, group=self.links[self.rank - 1])


class CrossAttnStage(Stage):
    """Stage 5 mixes in a memory of image features; it keeps its own contiguous buffers for the links."""

    def __init__(self, rank, n, links):
        super().__init__(rank, n, links)
        self.memory = nn.Parameter(torch.randn(DIM, DIM) * 0.1)
        self.grad_buf = torch.empty(B, DIM)

    def forward(self, x):
        return self.block(x + torch.tanh(x @ self.memory))

    def recv_grad(self, buf):
        dist.broadcast(self.grad_buf, src=self.rank + 1, group=self.links[self.rank])
        buf.copy_(self.grad_buf)

    def send_grad(self, grad):
        self.grad_buf.copy_(grad)
        dist.broadcast(self.grad_buf, src=self.rank, group=self.links[self.rank])


def main():
    rank = dist.get_rank()
    init_device_mesh("cpu", (8,), mesh_dim_names=("pp",))
    n = dist.get_world_size()
    links = [dist.new_group([s, s + 1]) for s in range(n - 1)]
    torch.manual_seed(rank)
    stage = CrossAttnStage(rank, n, links) if rank == 5 else Stage(rank, n, links)
    opt = torch.optim.SGD(stage.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        opt.zero_grad()
        x = torch.randn(B, DIM, generator=gen)
        if rank == 0:
            inp = x
        else:
            inp = torch.empty(B, DIM)
            stage.recv_activation(inp)
            inp.requires_grad_(True)
        out = stage(inp)
        if rank < n - 1:
            stage.send_activation(out.detach().clone())
        if rank == n - 1:
            loss = (out ** 2).mean()
            loss.backward()
        else:
            g = torch.empty(B, DIM)
            stage.recv_grad(g)
            out.backward(g)
            loss = torch.zeros(())
        if rank > 0:
            stage.send_grad(inp.grad)
        gn = torch.stack([p.grad.norm() for p in stage.parameters()]).norm().reshape(1) ** 2
        dist.all_reduce(gn)
        opt.step()
        if rank == n - 1:
            print(f"step {step} loss {loss.item():.4f} grad norm {gn.sqrt().item():.4f}", flush=True)


if __name__ == "__main__":
    frcase.run(main)
