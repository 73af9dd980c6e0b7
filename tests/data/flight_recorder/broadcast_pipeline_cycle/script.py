"""Two 4-stage pipelines (ranks 0-3 and 4-7) pass activations by broadcasts on 2-rank groups made in one loop, as
DeepSpeed's pipeline does, then every rank meets in a barrier. The first-stage test uses the global rank, so rank 4
receives from the wrap-around peer 7: 4 -> 7 -> 6 -> 5 -> 4 wait on one another. The cause is rank 4."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    rank = dist.get_rank()
    base, stage = rank - rank % 4, rank % 4
    pairs = {}
    for start in (0, 4):
        for s in range(4):
            a, b = start + s, start + (s + 1) % 4
            pairs[(a, b)] = dist.new_group(sorted((a, b)))
    x = torch.zeros(8)
    for _ in range(2):
        first = rank == 0  # the bug: the first stage is stage 0 of either pipeline
        if not first:
            prev = base + (stage - 1) % 4
            dist.broadcast(x, src=prev, group=pairs[(prev, rank)])
        if stage != 3:
            dist.broadcast(x, src=rank, group=pairs[(rank, rank + 1)])
    dist.barrier()


frcase.run(main)
