"""2-stage pipeline x data parallel x tensor parallel on a 3-D (pp=2, dp=2, tp=2) mesh: stage 0 on
host 0, stage 1 on host 1. Each pp group is a 2-rank link (activations broadcast from stage 0, gradients
from stage 1). Tensor parallel MLPs use Megatron's f/g all-reduces. The last stage monitors the mean
square of its output activations across the data-parallel replicas (tp rank 0 only: the output is
replicated across the tp pair)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

DIM, BS, STEPS = 32, 8, 5


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class TPMLP(nn.Module):
    def __init__(self, group):
        super().__init__()
        self.group = group
        self.up = nn.Linear(DIM, DIM, bias=False)
        self.down = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        return x + ReduceFromTP.apply(self.down(torch.relu(self.up(CopyToTP.apply(x, self.group)))), self.group)


def main():
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    stage, dp, tp = mesh.get_local_rank("pp"), mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    pp_group, tp_group = mesh.get_group("pp"), mesh.get_group("tp")
    first, last = dist.get_global_rank(pp_group, 0), dist.get_global_rank(pp_group, 1)
    torch.manual_seed(10 * stage + tp)
    block = nn.Sequential(TPMLP(tp_group), TPMLP(tp_group))
    opt = torch.optim.SGD(block.parameters(), lr=0.01)
    for step in range(STEPS):
        if stage == 0:
            x = torch.randn(BS, DIM, generator=torch.Generator().manual_seed(100 * dp + step))
        else:
            x = torch.empty(BS, DIM)
            dist.broadcast(x, src=first, group=pp_group)
            x.requires_grad_()
        y = block(x)
        if stage == 0:
            dist.broadcast(y.detach(), src=first, group=pp_group)
            g = torch.empty(BS, DIM)
            dist.broadcast(g, src=last, group=pp_group)
            y.backward(g)
        else:
            if tp == 0:
                sq = y.detach().pow(2)
                dist.all_reduce(sq, group=mesh.get_group("tp"))
                rms = (sq.mean() / mesh.size(1)).sqrt()
            loss = y.pow(2).mean()
            loss.backward()
            dist.broadcast(x.grad, src=last, group=pp_group)
        for p in block.parameters():
            dist.all_reduce(p.grad, group=mesh.get_group("dp"))
        opt.step()
        opt.zero_grad()
        if stage == 1 and tp == 0 and dp == 0:
            print(f"step {step} loss {loss.item():.4f} act rms {rms.item():.3f}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    frcase.run(main)
