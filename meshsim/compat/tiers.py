"""Patches of torch that a tier's transport needs, not the code under test: the fake tier's group creation at a
million ranks, and the threaded process group's reduce-scatter by max and min."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .patching import arguments, patch, wrap

DEVICE_MESH = "torch.distributed.device_mesh.DeviceMesh"


@patch("fake.skip-non-member-groups", "the fake tier's group creation at a million ranks (each rank makes only its own "
       "groups; torch's own path, slower, where the patch does not apply)",
       targets=(f"{DEVICE_MESH}._init_one_process_group",), optional=(f"{DEVICE_MESH}._init_one_process_group",),
       needs={f"{DEVICE_MESH}._init_one_process_group": ("sub_layout", "rank_map", "dim_name", "backend_override")},
       written_for="2.10.0-2.15.0")
def _skip_non_member_groups(rank_of: Callable[[], int]) -> None:
    """DeviceMesh's groups of one dim: a valid group without this rank only advances torch's group counter, and
    all of those are counted at once; new_group runs (torch's code) for the rank's own groups and the first invalid
    one. The dims this does not cover (the whole world, a backend override, split_group) take torch's own path."""
    import torch.distributed.device_mesh as dm
    import torch.distributed.distributed_c10d as c10d

    if getattr(dm.DeviceMesh, "_init_one_process_group", None) is None:
        return  # torch 2.9 makes a mesh's groups in one method: its own path

    def init_one_process_group(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        call = arguments(real, args, kwargs)
        sub_layout, rank_map, dim_name = call["sub_layout"], call["rank_map"], call["dim_name"]
        backend_override = call["backend_override"]
        world = c10d._get_default_group().size()
        if backend_override != (None, None):  # a backend named for a dim: here every group is a fake one too
            backend, options = backend_override
            return real(**dict(call, backend_override=("fake" if backend is not None else None, options)))
        if sub_layout.numel() == world or call.get("preserve_rank_order"):  # torch's own path
            return real(*args, **kwargs)
        rows = dm._MeshLayout([sub_layout]).remap_to_tensor(rank_map)
        bad = rows.size(0) if _distinct_in_world(rank_map, world) else _first_invalid(rows, world)
        mine = (rows == rank_of()).any(dim=1).nonzero().flatten().tolist()
        start, name = c10d._world.group_count, None
        for index in [i for i in mine if i < bad] + ([bad] if bad < rows.size(0) else []):
            c10d._world.group_count = start + index  # the groups before it only advanced the counter
            group = dm.new_group(ranks=rows[index].tolist(), group_desc=f"mesh_{dim_name}")
            if index in mine:
                if name is not None:
                    raise RuntimeError(f"Each device mesh dimension should get only one process group, but got "
                                       f"{rank_of()} in {rows[index].tolist()}!")
                name = group.group_name
        c10d._world.group_count = start + rows.size(0)
        return name

    wrap(dm.DeviceMesh, "_init_one_process_group", init_one_process_group, static=True)


_checked_maps: dict[int, tuple[Any, bool]] = {}


def _distinct_in_world(rank_map: Any, world: int) -> bool:
    """Whether a mesh's ranks are distinct ranks of the world: then no group of its dims is invalid (its layout
    does not overlap, which torch checks). Once per rank map, not once per dim."""
    hit = _checked_maps.get(id(rank_map))
    if hit is None or hit[0] is not rank_map:
        n = rank_map.numel()
        ok = n <= world and (n == 0 or (int(rank_map.min()) >= 0 and int(rank_map.max()) < world
                                        and rank_map.unique().numel() == n))
        _checked_maps.clear()
        hit = _checked_maps[id(rank_map)] = (rank_map, ok)
    return bool(hit[1])


def _first_invalid(rows: Any, world: int) -> int:
    """The first group (row) new_group refuses: repeated ranks, ranks outside the world, more ranks than it has."""
    ordered = rows.sort(dim=1).values
    invalid = (ordered[:, 0] < 0) | (ordered[:, -1] >= world)
    if rows.size(1) > 1:
        invalid |= (ordered[:, 1:] == ordered[:, :-1]).any(dim=1)
    if rows.size(1) > world:
        invalid[:] = True
    return int(invalid.nonzero()[0, 0]) if bool(invalid.any()) else int(rows.size(0))


@patch("threaded.reduce-scatter-max-min", "Partial(max|min) -> Shard on the thread tier",
       targets=("torch.testing._internal.distributed.multi_threaded_pg.ReduceScatter",))
def _reduce_scatter_max_and_min() -> None:
    """torch's threaded process group reduce-scatters only by sum and avg; DTensor's Partial(max|min) -> Shard
    needs max and min. The threaded group is this tier's transport, not the code under test: teach it both."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed import multi_threaded_pg as threaded

    def extreme(op: Any) -> Any:  # a ReduceOp compares equal to its enum value but does not hash like it
        return torch.maximum if op == dist.ReduceOp.MAX else torch.minimum if op == dist.ReduceOp.MIN else None

    class ReduceScatter(threaded.ReduceScatter):
        def __init__(self, op: Any):
            if extreme(op) is not None:
                self.op = op
            else:
                super().__init__(op)

        @torch.no_grad()
        def work(self, data: Any) -> None:
            pick = extreme(self.op)
            if pick is None:
                return super().work(data)
            for i, (outputs, _) in enumerate(data):
                chunks = [each[1][0][i].to(outputs[0].device) for each in data]
                result = chunks[0]
                for chunk in chunks[1:]:
                    result = pick(result, chunk)
                outputs[0].detach().copy_(result)

    threaded.ReduceScatter = ReduceScatter  # type: ignore[misc]


@patch("ranks-in-one-process.transform-infos", "a redistribute's plan per rank where one process plays several",
       targets=("torch.distributed.tensor._redistribute._gen_transform_infos",))
def _transform_infos_per_rank() -> None:
    """torch caches a redistribute's transforms by the two specs alone (functools.cache), yet each transform holds
    the logical shape at the rank's own coordinate: one rank a process never tells them apart, but where one
    process plays several ranks (the thread and fake tiers) a rank got another's shapes (an uneven Shard -> Shard
    on the fake tier gave coordinate 1 the rows of coordinate 0, where torch's fake group alone gives none). The
    transforms are computed afresh for every call there, as each rank's own process would first compute them."""
    from torch.distributed.tensor import _redistribute

    _redistribute._gen_transform_infos = _redistribute._gen_transform_infos_non_cached  # type: ignore[assignment]
