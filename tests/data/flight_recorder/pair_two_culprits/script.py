"""Expert pairs (new_subgroups of 2) exchange routed activations with all_gather; expert gradients
are then averaged across the pairs in two parity groups (new_subgroups_by_enumeration), and the
loss is averaged over the world. A rank that receives a corrupted (non-finite) half from its partner
asks for it again; a rank with no tokens routed to it has nothing to exchange."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import frcase  # noqa: E402

DIM, STEPS, SEED = 8, 4, 1315


def main():
    rank = dist.get_rank()
    pair, _ = dist.new_subgroups(group_size=2)
    parity, _ = dist.new_subgroups_by_enumeration([[0, 2, 4, 6], [1, 3, 5, 7]])
    partner = 1 - rank % 2
    w = torch.ones(DIM)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(SEED * 100 + step * 8 + rank)
        n_routed = int(torch.randint(0, 16, (1,), generator=g))
        gain = 1e4 if torch.rand(1, generator=g) < 0.06 else 1.0  # occasional activation spike
        act = (torch.randn(DIM, generator=g) * n_routed * gain).half().float()  # the expert runs in fp16
        if n_routed > 0:
            halves = [torch.empty(DIM), torch.empty(DIM)]
            dist.all_gather(halves, act, group=pair)
            if not torch.isfinite(halves[partner]).all():
                dist.all_gather(halves, act, group=pair)  # retry the exchange once
            combined = torch.cat(halves)
        else:
            combined = torch.zeros(2 * DIM)
        grad = combined[:DIM].nan_to_num(posinf=0.0, neginf=0.0) * 0.01
        dist.all_reduce(grad, group=parity)
        w -= grad / 4
        loss = torch.tensor([w.pow(2).sum().item()])
        dist.all_reduce(loss)
    dist.barrier()


frcase.run(main)
