"""8-stage pipeline (one stage per rank) whose point-to-point traffic goes through broadcasts on
2-rank groups, one group per pair of adjacent stages (the lower stage is the group's rank 0).
The first stage on each node receives its activations over the network into a staging buffer."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import frcase  # noqa: E402

GPUS_PER_NODE, HIDDEN, MB, MICRO, STEPS = 4, 8, 4, 2, 3


def main():
    rank, world = dist.get_rank(), dist.get_world_size()
    links = [dist.new_group([s, s + 1]) for s in range(world - 1)]  # links[s] joins stage s and s+1
    up = links[rank - 1] if rank > 0 else None
    down = links[rank] if rank < world - 1 else None
    torch.manual_seed(rank)
    w = torch.randn(HIDDEN, HIDDEN) * 0.3
    staging = torch.zeros(MB, HIDDEN)
    for step in range(STEPS):
        inputs = []
        for mb in range(MICRO):
            if up is None:
                torch.manual_seed(step * 10 + mb)
                x = torch.randn(MB, HIDDEN)
            elif rank % GPUS_PER_NODE == 0:  # inter-node hop: land in the staging buffer
                dist.broadcast(staging, group_src=0, group=down)
                x = staging.clone()
            else:
                x = torch.zeros(MB, HIDDEN)
                dist.broadcast(x, group_src=0, group=up)
            inputs.append(x)
            y = torch.tanh(x @ w)
            if down is not None:
                dist.broadcast(y, group_src=0, group=down)
        for mb in reversed(range(MICRO)):
            g = torch.ones(MB, HIDDEN) / MB
            if down is not None:
                dist.broadcast(g, group_src=1, group=down)
            g = (g * (1 - torch.tanh(inputs[mb] @ w).pow(2))) @ w.t()
            if up is not None:
                dist.broadcast(g, group_src=1, group=up)
        loss = torch.tensor([inputs[0].pow(2).mean().item()])
        dist.all_reduce(loss)
    dist.barrier()


frcase.run(main)
