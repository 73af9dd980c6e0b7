"""The torch calls of a plan, without meshsim: the baselines' shared pieces (every section of bench/).

A baseline runs the same plan as meshsim does, torch call for torch call, reading the results back as meshsim's
ranks do, with nothing else: no progress reports, no model, no verdict, no record. What meshsim costs on top of
it is its overhead.
"""

from __future__ import annotations

from typing import Any


def check_step(mesh: Any, rank: int, world: int, read: bool = True) -> dict[str, Any]:
    """What meshsim's `check` step asks torch: the mesh's facts and tensor, every dim's group (by index and by
    name) and local rank, all_reduce/all_gather/broadcast on it with their results read back (read=False: not
    read, as on the fake tier, where nothing moves), get_all_groups."""
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
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, torch.tensor([rank]), group=group)
        t = torch.tensor([rank])
        dist.broadcast(t, group=group, group_src=0)
        if read:
            entry["all_reduce"] = [i for i, v in enumerate(x.tolist()) if v == 1.0]
            entry["all_gather"] = [int(v.item()) for v in out]
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


# --------------------------------------------------------------------------------------------- process tier

def _process_rank(rank: int, world: int, port: int, plans: list, out: Any) -> None:
    """One rank of the raw process loop: the plans' meshes, a check step each, a barrier, the groups destroyed."""
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    baseline = set(c10d._world.pg_map)
    dist.barrier()
    started = time.monotonic()
    for shape, names in plans:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        check_step(mesh, rank, world)
        dist.barrier()
        destroy_new_groups(mesh, baseline)
    dist.barrier()
    if rank == 0:
        out["rate"] = len(plans) / (time.monotonic() - started)
    dist.destroy_process_group()


def process_loop(world: int, plans: list) -> float:
    """Plans per second of the raw loop on `world` persistent gloo processes (forkserver, as meshsim's)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with ctx.Manager() as manager:
        out = manager.dict()
        procs = [ctx.Process(target=_process_rank, args=(r, world, store.port, plans, out)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)
        return float(out["rate"])


# --------------------------------------------------------------------------------------------- thread tier

def threaded_loop(world: int, count: int, shape: tuple[int, ...], names: tuple[str, ...]) -> float:
    """Plans per second of the raw loop on torch's threaded process group (threads of this process)."""
    import threading
    import time

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.multi_threaded_pg import _install_threaded_pg, _uninstall_threaded_pg

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store = dist.HashStore()
    barrier = threading.Barrier(world)
    out: dict[str, float] = {}

    def rank_loop(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
        baseline = set(c10d._world.pg_map)
        barrier.wait()
        started = time.monotonic()
        for _ in range(count):
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
            check_step(mesh, rank, world)
            barrier.wait()
            destroy_new_groups(mesh, baseline)
        if rank == 0:
            out["rate"] = count / (time.monotonic() - started)
        dist.destroy_process_group()

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _uninstall_threaded_pg()
    torch._C._distributed_c10d._set_thread_isolation_mode(False)
    return out["rate"]


# --------------------------------------------------------------------------------------------- fake tier

def fake_per_rank(world: int, shape: tuple[int, ...], ranks: int) -> float:
    """Seconds per rank for torch's own DeviceMesh build, a check's queries and its collectives, one rank alone on
    torch's fake process group (a spread of `ranks` ranks, in this process)."""
    import time

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    names = tuple("abcdefgh"[:len(shape)])
    started = time.monotonic()
    for r in range(ranks):
        rank = r * 7919 % world
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        check_step(mesh, rank, world, read=False)
        dist.destroy_process_group()
    return (time.monotonic() - started) / ranks
