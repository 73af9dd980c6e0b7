"""Two 4-stage pipelines (ranks 0-3 and 4-7) pass activations with send/recv, then all_reduce across the
pipelines (groups [s, s + 4]), two steps; in the second, rank 5 skips its send to rank 6. gloo's Flight Recorder
records no send or recv: ranks 6 and 7 wait in receives it does not show, and only the op_ids of the collectives
around them tell that point-to-point calls were made. The cause is rank 5."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import frcase  # noqa: E402


def main():
    rank = dist.get_rank()
    stage = rank % 4
    groups = [dist.new_group([s, s + 4]) for s in range(4)]
    x = torch.zeros(8)
    for step in range(2):
        if stage != 0:
            dist.recv(x, src=rank - 1)
        if stage != 3 and not (rank == 5 and step == 1):
            dist.send(x + 1, dst=rank + 1)
        dist.all_reduce(x, group=groups[stage])
    dist.barrier()


frcase.run(main)
