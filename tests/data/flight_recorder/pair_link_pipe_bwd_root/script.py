"""An 8-stage pipeline over 2 hosts x 4 devices (one stage per device). Neighbouring stages exchange
activations and gradients by broadcasts on 2-rank link groups {s, s+1}; GPipe schedule, 2 microbatches;
the loss is averaged over the world at the end of each step. The penultimate stage feeds the classifier
head and has its own gradient-receive helper (it also keeps the head's input grads for a probe)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEVICES_PER_HOST, DIM, MB, N_MICRO, STEPS = 4, 24, 4, 2, 5


def main():
    rank, world = dist.get_rank(), dist.get_world_size()
    stage, host = rank, rank // DEVICES_PER_HOST
    links = {(s, s + 1): dist.new_group([s, s + 1]) for s in range(world - 1)}
    prev = stage - 1 if stage > 0 else None
    nxt = stage + 1 if stage < world - 1 else None
    penultimate = world - 2
    torch.manual_seed(stage)
    block = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU())
    head = nn.Linear(DIM, 3) if nxt is None else None
    params = list(block.parameters()) + (list(head.parameters()) if head else [])
    opt = torch.optim.SGD(params, lr=0.05)
    probe = []

    def recv_act():
        buf = torch.empty(MB, DIM)
        dist.broadcast(buf, src=prev, group=links[(prev, stage)])
        return buf.requires_grad_()

    def recv_grad():
        buf = torch.empty(MB, DIM)
        dist.broadcast(buf, src=nxt, group=links[(stage, nxt)])
        return buf

    def recv_head_grad():
        buf = torch.empty(MB, DIM)
        dist.broadcast(buf, src=prev, group=links[(prev, stage)])
        probe.append(buf.norm().item())
        return buf

    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        data = torch.randn(N_MICRO, MB, DIM, generator=g)
        labels = torch.randint(0, 3, (N_MICRO, MB), generator=g)
        opt.zero_grad()
        saved, losses = [], []
        for m in range(N_MICRO):
            x = data[m].clone().requires_grad_() if prev is None else recv_act()
            y = block(x)
            if nxt is None:
                y = F.cross_entropy(head(y), labels[m]) / N_MICRO
                losses.append(y.item())
            else:
                dist.broadcast(y.detach().clone(), src=stage, group=links[(stage, nxt)])
            saved.append((x, y))
        for m in reversed(range(N_MICRO)):
            x, y = saved[m]
            if nxt is None:
                y.backward()
            else:
                y.backward(recv_head_grad() if stage == penultimate else recv_grad())
            if prev is not None:
                dist.broadcast(x.grad.clone(), src=stage, group=links[(prev, stage)])
        opt.step()
        total = torch.tensor([float(sum(losses))])
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step} host {host} loss {total.item():.4f}", flush=True)


if __name__ == "__main__":
    frcase.run(main)
