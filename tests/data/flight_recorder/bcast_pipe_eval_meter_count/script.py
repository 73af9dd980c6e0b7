"""4-stage pipeline across 2 hosts on the 'pp' dim of a (pp=4, dp=2) mesh (stages 0-1 on host 0, 2-3 on
host 1), stages linked by 2-rank process groups (activations broadcast from the earlier stage, gradients
from the later one). Every EVAL_EVERY steps a forward-only eval pass runs through the pipeline before the
training step. The last stage computes the losses and keeps the loss meter, whose count is the step."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

DIM, BS, STEPS, EVAL_EVERY = 32, 8, 6, 2


class Meter:
    def __init__(self):
        self.count, self.total = 0, 0.0

    def update(self, value):
        self.count += 1
        self.total += value


def main():
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("pp", "dp"))
    stage, n_stages, dp = mesh.get_local_rank("pp"), mesh.size(0), mesh.get_local_rank("dp")
    links = {}
    for d in range(mesh.size(1)):  # every rank creates every link group, in the same order
        chain = [s * mesh.size(1) + d for s in range(n_stages)]
        for s in range(n_stages - 1):
            g = dist.new_group([chain[s], chain[s + 1]])
            if d == dp:
                links[s] = (g, chain[s], chain[s + 1])
    is_last = stage == n_stages - 1
    torch.manual_seed(stage)
    layer = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh(), nn.Linear(DIM, DIM))
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    train_meter, eval_meter = Meter(), Meter()

    def forward(x_src):
        if stage == 0:
            x = x_src
        else:
            g, lo, _ = links[stage - 1]
            x = torch.empty(BS, DIM)
            dist.broadcast(x, src=lo, group=g)
            x.requires_grad_(torch.is_grad_enabled())
        y = layer(x)
        if not is_last:
            g, lo, _ = links[stage]
            dist.broadcast(y.detach(), src=lo, group=g)
        return x, y

    for step in range(STEPS):
        current = train_meter.count if is_last else step
        if current > 0 and current % EVAL_EVERY == 0:
            with torch.no_grad():
                _, y = forward(torch.randn(BS, DIM, generator=torch.Generator().manual_seed(-step - 1 & 0xffff)))
            if is_last:
                train_meter.update(y.pow(2).mean().item())
        batch = torch.randn(BS, DIM, generator=torch.Generator().manual_seed(100 * dp + step))
        x, y = forward(batch)
        if is_last:
            loss = y.pow(2).mean()
            loss.backward()
            train_meter.update(loss.item())
        else:
            g, _, hi = links[stage]
            grad = torch.empty(BS, DIM)
            dist.broadcast(grad, src=hi, group=g)
            y.backward(grad)
        if stage > 0:
            g, _, hi = links[stage - 1]
            dist.broadcast(x.grad, src=hi, group=g)
        for p in layer.parameters():
            dist.all_reduce(p.grad, group=mesh.get_group("dp"))
        opt.step()
        opt.zero_grad()
        if is_last and dp == 0:
            print(f"step {step} train loss {train_meter.total / train_meter.count:.4f}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    frcase.run(main)
