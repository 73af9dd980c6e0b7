"""The thread, fake and model tiers side by side with their baselines (imported by bench.py: `tiers`)."""

from __future__ import annotations

import resource
import threading
import time

from raw import destroy_new_groups
from rich.table import Table

THREAD_SHAPE, THREAD_NAMES = (4, 4, 4), ("a", "b", "c")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def raw_threaded_loop(world: int, count: int) -> float:
    """The torch calls of a (4,4,4) plan with a check step, as threads on torch's threaded group: no harness."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.multi_threaded_pg import _install_threaded_pg, _uninstall_threaded_pg

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store = dist.HashStore()
    barrier = threading.Barrier(world)
    out: dict = {}

    def rank_loop(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
        baseline = set(c10d._world.pg_map)
        barrier.wait()
        started = time.monotonic()
        for _ in range(count):
            mesh = init_device_mesh("cpu", THREAD_SHAPE, mesh_dim_names=THREAD_NAMES)
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


def raw_fake_loop(world: int, shape: tuple, ranks: int) -> float:
    """Seconds per rank for the same DeviceMesh build and queries on torch's fake group, torch's code only."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    started = time.monotonic()
    for r in range(ranks):
        dist.init_process_group("fake", rank=r * 7919 % world, world_size=world, store=FakeStore())
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple("abcdef"[:len(shape)]))
        mesh.get_coordinate()
        for d in range(mesh.ndim):
            dist.get_process_group_ranks(mesh.get_group(d))
            mesh.get_local_rank(d)
        dist.destroy_process_group()
    return (time.monotonic() - started) / ranks


def tiers_section(console, big: bool = False) -> None:
    from meshsim import Plan, Topology, step
    from meshsim.tiers import open_executor

    check_plan = Plan((step("init_device_mesh", out="m", shape=list(THREAD_SHAPE), names=list(THREAD_NAMES)),
                       step("check", mesh="m")))
    table = Table(title="thread tier: W=64, (4,4,4) + check, plans/s (goal: >= 0.8x raw threaded loop, "
                        ">= 20x process tier)")
    for column in ("harness", "plans/s", "vs raw threaded loop"):
        table.add_column(column)
    raw = raw_threaded_loop(64, 8)
    with open_executor(Topology(8, 8), "thread") as executor:
        executor.run(check_plan)
        started = time.monotonic()
        for _ in range(8):
            assert executor.run(check_plan).passed
        ours = 8 / (time.monotonic() - started)
    with open_executor(Topology(8, 8), "process", start_timeout=600) as cluster:
        cluster.run(check_plan, deadline=120)
        started = time.monotonic()
        for _ in range(2):
            assert cluster.run(check_plan, deadline=120).passed
        process = 2 / (time.monotonic() - started)
    table.add_row("raw loop, same torch calls, threaded group", f"{raw:.2f}", "1.00")
    table.add_row("meshsim --tier thread (model + verdict per plan)", f"{ours:.2f}", f"{ours / raw:.2f}")
    table.add_row("meshsim --tier process (64 processes, gloo)", f"{process:.3f}",
                  f"{process / raw:.3f} (thread tier = {ours / process:.0f}x)")
    console.print(table)

    fake = Table(title="fake tier: every rank checked, 2 cores (goals: 4,096 ranks <= 45 s; 16,384 <= 600 s)")
    for column in ("mesh", "ranks checked", "seconds", "raw fake-group loop, 1 process (extrapolated)"):
        fake.add_column(column)
    cases = [((8, 8, 8, 8), Topology(512, 8))]
    if big:
        cases.append(((16, 16, 8, 8), Topology(2048, 8)))
    for shape, topology in cases:
        plan = Plan((step("init_device_mesh", out="m", shape=list(shape), names=list("abcd")),
                     step("check", mesh="m")))
        with open_executor(topology, "fake") as executor:
            started = time.monotonic()
            result = executor.run(plan, deadline=120)
            seconds = time.monotonic() - started
        assert result.passed, result.differences[:1]
        per_rank = raw_fake_loop(topology.world, shape, 64)
        fake.add_row(str(shape), f"{topology.world:,}", f"{seconds:.1f}", f"{per_rank * topology.world:.0f} s")
    console.print(fake)

    from meshsim.examples.layouts import NamedLayout

    layout = NamedLayout("5-d", (("pp", 16), ("dp_replicate", 4), ("dp_shard", 25), ("cp", 8), ("tp", 8)), 8, "")
    plan = Plan((step("init_device_mesh", out="m", shape=[s for _, s in layout.dims],
                      names=[n for n, _ in layout.dims]),
                 step("query", mesh="m", what="get_all_groups"), step("query", mesh="m", what="get_coordinate")))
    with open_executor(layout.topology, "model") as executor:
        started = time.monotonic()
        result = executor.run(plan, deadline=60)
        seconds = time.monotonic() - started
    console.print(f"model tier: every rank of a {layout.world:,}-rank 5-D layout (16,4,25,8,8) predicted and judged "
                  f"in {seconds:.1f} s (goal <= 5 s); {result.outcome}; controller max RSS {_rss_mb():.0f} MB")
