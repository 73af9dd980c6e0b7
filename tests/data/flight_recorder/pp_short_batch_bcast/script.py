"""Two 4-stage pipelines (one per host; mesh dp=2 x pp=4). Activations and gradients move by broadcasts on
2-rank link groups (dist.new_group per pair of neighbouring stages). GPipe schedule with N_MICRO
micro-batches; stage 0 cuts the step's batch into micro-batches; the other stages use the configured
count. Gradients are averaged over the dp pair of each stage.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

DEVICES_PER_HOST = 4
DIM, MICRO, N_MICRO = 16, 4, 2


def load(step, dp_rank):
    g = torch.Generator().manual_seed(10 * step + dp_rank)
    n = MICRO * N_MICRO if not (step == 1 and dp_rank == 1) else MICRO * N_MICRO - 2  # short shard tail
    return torch.randn(n, DIM, generator=g)


def main():
    mesh = init_device_mesh("cpu", (2, DEVICES_PER_HOST), mesh_dim_names=("dp", "pp"))
    rank = dist.get_rank()
    dp_rank, stage = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
    links = {}
    for d in range(2):
        for s in range(DEVICES_PER_HOST - 1):
            a = d * DEVICES_PER_HOST + s
            links[(a, a + 1)] = dist.new_group([a, a + 1])
    dp_group = mesh["dp"].get_group()
    first, last = stage == 0, stage == DEVICES_PER_HOST - 1
    up = None if first else links[(rank - 1, rank)]
    down = None if last else links[(rank, rank + 1)]

    torch.manual_seed(stage)
    block = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.Tanh())
    opt = torch.optim.SGD(block.parameters(), lr=0.01)

    for step in range(5):
        opt.zero_grad()
        if first:
            batch = load(step, dp_rank)
            n_micro = len(batch) // MICRO  # drop_last
        else:
            n_micro = N_MICRO
        ins, outs = [], []
        for mb in range(n_micro):
            if first:
                x = batch[mb * MICRO:(mb + 1) * MICRO].clone()
            else:
                x = torch.empty(MICRO, DIM)
                dist.broadcast(x, src=rank - 1, group=up)
                x.requires_grad_()
            y = block(x)
            if not last:
                dist.broadcast(y.detach().clone(), src=rank, group=down)
            ins.append(x)
            outs.append(y)
        for mb in reversed(range(n_micro)):
            if last:
                outs[mb].pow(2).mean().backward()
            else:
                gy = torch.empty(MICRO, DIM)
                dist.broadcast(gy, src=rank + 1, group=down)
                outs[mb].backward(gy)
            if not first:
                dist.broadcast(ins[mb].grad.clone(), src=rank, group=up)
        grads = torch.cat([p.grad.reshape(-1) for p in block.parameters()])
        dist.all_reduce(grads, group=dp_group)
        off = 0
        for p in block.parameters():
            p.grad.copy_(grads[off:off + p.numel()].view_as(p) / 2)
            off += p.numel()
        opt.step()
        if rank == 0:
            print(f"step {step} done", flush=True)


if __name__ == "__main__":
    frcase.run(main)
