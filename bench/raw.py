"""The torch calls of a plan, without meshsim: the baselines' shared pieces (every section of bench/).

A baseline runs the same plan as meshsim does, torch call for torch call, reading the results back as meshsim's
ranks do, with nothing else: no progress reports, no model, no verdict, no record. What meshsim costs on top of
it is its overhead.
"""

from __future__ import annotations

from typing import Any


def check_step(mesh: Any, rank: int, world: int) -> dict[str, Any]:
    """What meshsim's `check` step asks torch: the mesh's facts and tensor, every dim's group (by index and by
    name) and local rank, all_reduce/all_gather/broadcast on it with their results read back, get_all_groups."""
    import torch
    import torch.distributed as dist

    names = mesh.mesh_dim_names
    obs: dict[str, Any] = {"shape": list(mesh.shape), "ndim": mesh.ndim, "names": list(names) if names else None,
                           "coordinate": mesh.get_coordinate(), "mesh": mesh.mesh.tolist(), "size": mesh.size(),
                           "dims": []}
    for d in range(mesh.ndim):
        group = mesh.get_group(d)
        entry: dict[str, Any] = {"size": mesh.size(d), "group": dist.get_process_group_ranks(group),
                                 "local_rank": mesh.get_local_rank(d)}
        if names:
            entry["group_by_name"] = dist.get_process_group_ranks(mesh.get_group(names[d]))
            entry["local_rank_by_name"] = mesh.get_local_rank(names[d])
        x = torch.zeros(world)
        x[rank] = 1
        dist.all_reduce(x, group=group)
        entry["all_reduce"] = [i for i, v in enumerate(x.tolist()) if v == 1.0]
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, torch.tensor([rank]), group=group)
        entry["all_gather"] = [int(t.item()) for t in out]
        t = torch.tensor([rank])
        dist.broadcast(t, group=group, group_src=0)
        entry["broadcast"] = int(t.item())
        obs["dims"].append(entry)
    obs["all_groups"] = [dist.get_process_group_ranks(g) for g in mesh.get_all_groups()]
    return obs


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
