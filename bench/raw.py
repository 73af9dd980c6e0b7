"""The torch calls of a plan, without meshsim: the baselines' shared pieces (bench.py, tiers.py)."""

from __future__ import annotations

from typing import Any


def check_collectives(group: Any, rank: int, world: int) -> None:
    """What a check step runs on one dim's group: all_reduce of a one-hot, all_gather, broadcast."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(world)
    x[rank] = 1
    dist.all_reduce(x, group=group)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(group.size())]
    dist.all_gather(gathered, torch.tensor([rank]), group=group)
    dist.broadcast(torch.tensor([rank]), group=group, group_src=0)


def destroy_new_groups(mesh: Any, baseline: set) -> None:
    """Drop the mesh's flatten cycle and destroy every group made since `baseline`, as meshsim's teardown."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    mesh._flatten_mapping.clear()
    for pg in list(c10d._world.pg_map):
        if pg not in baseline:
            try:
                dist.destroy_process_group(pg)
            except KeyError:  # the threaded group forgets its name before c10d unregisters it (torch 2.13)
                pass
