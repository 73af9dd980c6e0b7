"""meshsim benchmarks, each next to a baseline measured in the same run. Prints tables; asserts nothing.

    python bench/bench.py                 # everything (a few minutes on 2 cores)
    python bench/bench.py start plans     # some sections: start, plans, fuzz, find, memory

start   cluster ready time for W = 4, 8, 16, 32 (fresh process: forkserver + torch import included),
        next to torch.multiprocessing spawn of the same ranks joining a gloo world
plans   plans/s at W = 8 next to the same torch calls in a raw loop (bench/process.py), and spawn-per-test
fuzz    generated examples/s at W = 8 and W = 16
sweep   the default sweep at W = 8 by seed: branch coverage per torch file, examples/s next to the same sweep
        without DTensor steps, the produced-and-checked matrix, seeded DTensor and DeviceMesh bugs caught
find    time for `fuzz` to find and shrink a bug injected into DeviceMesh in the workers
memory  worker RSS and PSS (shared pages split) at W = 8
launch  each example script under `meshsim launch` (unchanged, simulated GPUs) next to `torchrun --standalone` of
        it on CPU/gloo (a device edit): wall time and per-step time (goal <= 1.2x), and a hang's time to diagnosis
        (goal <= deadline + 1 s)
tiers   the thread, fake and model sections of `python -m bench` (bench/thread.py, fake.py, model.py)

`python -m bench` runs the sections that carry goals (process, thread, fake, model, launch, memory) in one run,
with JSON output and comparison; see bench/__main__.py.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

from launch_vs_torchrun import launch_section
from rich.console import Console
from rich.table import Table

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")  # the injected bugs live with the tests (faults.py)
console = Console(width=160)
SHAPES = [((2, 4), ("dp", "tp")), ((2, 2, 2), ("dp", "cp", "tp"))]
ROUNDS = 5  # this 2-core machine is noisy: rounds alternate meshsim and the raw loop, the table shows medians


def _py(code: str, timeout: float = 600) -> dict:
    """Run code in a fresh interpreter; it prints one JSON line last."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=timeout, cwd=HERE)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------- start

def start_section() -> None:
    table = Table(title="Cluster start (fresh process each; seconds until every rank has joined)")
    for col in ("W", "meshsim cold", "meshsim warm (2nd cluster)", "spawn baseline", "speed-up (cold)"):
        table.add_column(col, justify="right")
    for hosts, devices in ((1, 4), (2, 4), (2, 8), (4, 8)):
        world = hosts * devices
        ours = _py(f"""
            import time, json
            t = time.monotonic()
            from meshsim import Topology
            from meshsim import Cluster
            if __name__ == "__main__":
                c = Cluster(Topology({hosts}, {devices})).start(); cold = time.monotonic() - t; c.close()
                t = time.monotonic(); c = Cluster(Topology({hosts}, {devices})).start(); warm = time.monotonic() - t
                c.close()
                print(json.dumps({{"cold": cold, "warm": warm}}))
        """)
        spawn = _py(f"""
            import time, json
            t = time.monotonic()
            import torch.multiprocessing as mp
            from bench import spawn_join
            if __name__ == "__main__":
                spawn_join({world})
                print(json.dumps({{"spawn": time.monotonic() - t}}))
        """)
        table.add_row(str(world), f"{ours['cold']:.2f}", f"{ours['warm']:.2f}", f"{spawn['spawn']:.2f}",
                      f"{spawn['spawn'] / ours['cold']:.1f}x")
    console.print(table)


def _join_world(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    dist.barrier()
    dist.destroy_process_group()


def spawn_join(world: int) -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.spawn(_join_world, args=(world, store.port), nprocs=world, join=True)


# --------------------------------------------------------------------------------------------- plans

def _spawn_test_rank(rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    for d in range(mesh.ndim):
        x = torch.zeros(world)
        dist.all_reduce(x, group=mesh.get_group(d))
    dist.barrier()
    dist.destroy_process_group()


def spawn_per_test(world: int) -> float:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    started = time.monotonic()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.spawn(_spawn_test_rank, args=(world, store.port), nprocs=world, join=True)
    return time.monotonic() - started


def plans_section() -> None:
    """The process section of `python -m bench` (plans/s at W = 8 next to the raw loop), and a spawn-per-test
    harness beside them."""
    from figures import table
    from process import run

    console.print(table(run(), "process tier"))
    spawn = [spawn_per_test(8) for _ in range(2)]
    console.print(f"  spawn per test (8 ranks): {', '.join(f'{s:.1f} s' for s in spawn)} a test")


# --------------------------------------------------------------------------------------------- fuzz

def fuzz_section(examples: int = 150) -> None:
    from meshsim import Cluster, Topology
    from meshsim.sweep.loop import fuzz

    table = Table(title=f"fuzz: generated plans per second ({examples} examples, seed 0)")
    for col in ("W", "examples/s", "outcomes", "hangs (deadline)"):
        table.add_column(col, justify="right")
    for hosts, devices in ((2, 4), (4, 4)):
        with Cluster(Topology(hosts, devices), deadline=10) as cluster:
            report = fuzz(cluster, examples, seed=0, deadline=10)
        table.add_row(str(hosts * devices), f"{report.rate:.1f}", json.dumps(dict(report.outcomes)),
                      str(report.outcomes.get("hang", 0)))
    console.print(table)


def dtensor_section(examples: int = 400) -> None:
    """The default sweep at W = 8 (goal: >= 8 plans/s with DTensor steps in it), beside the same sweep with the
    DTensor steps switched off, measured in the same run."""
    from meshsim import Cluster, Topology
    from meshsim.sweep import strategies
    from meshsim.sweep.loop import fuzz

    table = Table(title=f"fuzz --hosts 2 --devices-per-host 4 --examples {examples}: DTensor's cost")
    for col in ("seed", "plans/s with DTensor", "DTensor steps", "plans/s without", "outcomes"):
        table.add_column(col, justify="right")
    dtensor_ops = ("distribute", "redistribute", "full_tensor", "to_local", "from_local", "sum", "dtensor")
    with Cluster(Topology(2, 4), deadline=10) as cluster:
        for seed in (1, 2, 3):
            report = fuzz(cluster, examples, seed=seed, deadline=10)
            steps = sum(report.ops.get(op, 0) for op in dtensor_ops)
            saved = dict(strategies.WEIGHTS)
            try:
                for op in dtensor_ops:
                    strategies.WEIGHTS.pop(op, None)
                baseline = fuzz(cluster, examples, seed=seed, deadline=10)
            finally:
                strategies.WEIGHTS.clear()
                strategies.WEIGHTS.update(saved)
            table.add_row(str(seed), f"{report.rate:.1f}", str(steps), f"{baseline.rate:.1f}",
                          json.dumps(dict(report.outcomes)))
    console.print(table)


def sweep_section(examples: int = 400, seeds: tuple[int, ...] = (1, 2, 3)) -> None:
    """The default sweep at W = 8 (`meshsim fuzz --hosts 2 --devices-per-host 4 --examples 400`), by seed: branch
    coverage of each torch file (--coverage), examples/s next to the same sweep without DTensor steps measured
    in the same run (goal: >= 8 with them), what it produced and checked, and seeded DTensor and DeviceMesh bugs
    (tests/faults.py) caught by a default sweep."""
    import tempfile

    from meshsim import Cluster, Topology
    from meshsim.sweep import strategies
    from meshsim.sweep.coverage import MODULES, combine
    from meshsim.sweep.loop import fuzz
    from meshsim.sweep.tables import render_produced

    reaches, rates, produced = {}, [], None
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="meshsim-coverage-") as measured:
            with Cluster(Topology(2, 4), deadline=10, coverage_dir=measured) as cluster:
                report = fuzz(cluster, examples, seed=seed, deadline=10)
            reaches[seed] = combine(measured)
        produced = produced or report.produced
        with Cluster(Topology(2, 4), deadline=10) as cluster:
            full = fuzz(cluster, examples, seed=seed, deadline=10)
            saved = dict(strategies.WEIGHTS)
            try:
                for op in ("distribute", "redistribute", "full_tensor", "to_local", "from_local", "sum", "dtensor"):
                    strategies.WEIGHTS.pop(op, None)
                bare = fuzz(cluster, examples, seed=seed, deadline=10)
            finally:
                strategies.WEIGHTS.clear()
                strategies.WEIGHTS.update(saved)
        rates.append((seed, full.rate, bare.rate, report.rate, full.passed and report.passed))
    table = Table(title=f"branch coverage of torch's code by a default sweep ({examples} plans, W = 8), by seed")
    table.add_column("file")
    for seed in seeds:
        table.add_column(f"seed {seed}", justify="right")
    for module in MODULES:
        row = [module.replace("torch/distributed/", "")]
        for seed in seeds:
            hit = next((f for f in reaches[seed].files if f.path == module), None)
            row.append(f"{hit.branch_percent:.1f}% of {hit.branches}" if hit else "-")
        table.add_row(*row)
    table.add_row("all", *(f"{reaches[seed].branch_percent:.1f}%" for seed in seeds))
    console.print(table)
    table = Table(title="examples/s at W = 8, each row's columns measured in the same run (uptime's load beside)")
    for col in ("seed", "default sweep", "without DTensor steps", "with --coverage", "agrees"):
        table.add_column(col, justify="right")
    for seed, full, bare, covered, agreed in rates:
        table.add_row(str(seed), f"{full:.1f}", f"{bare:.1f}", f"{covered:.1f}", str(agreed))
    console.print(table)
    console.print(f"  load average at the end: {os.getloadavg()[0]:.1f}")
    render_produced(produced, console)
    _seeded_bugs(examples)


def _seeded_bugs(examples: int) -> None:
    from meshsim import Cluster, Topology
    from meshsim.sweep.loop import fuzz

    table = Table(title=f"seeded bugs (tests/faults.py) against a default sweep of {examples} plans at W = 8, seed 1")
    for col in ("bug", "caught", "after", "plans", "shrunk to"):
        table.add_column(col, overflow="fold")
    for fault in ("outer_shard_to_shard_flipped", "partials_reduced_on_one_dim", "outer_reduce_scatter_rolled",
                  "uneven_gather_drops_last", "concatenate_reverses_dims", "unflatten_swaps_sizes",
                  "slices_lose_a_rank", "wrong_local_rank"):
        with Cluster(Topology(2, 4), deadline=10, setup=f"faults:{fault}") as cluster:
            report = fuzz(cluster, examples, seed=1, deadline=10)
        plan = " ; ".join(report.failure.plan.describe()) if report.failure else "-"
        table.add_row(fault, str(not report.passed), f"{report.time_to_failure or 0:.1f} s", str(report.examples),
                      plan)
    console.print(table)


def find_section() -> None:
    from meshsim import Cluster, Topology
    from meshsim.sweep.loop import fuzz

    table = Table(title="fuzz at W = 8: finding and shrinking bugs injected into DeviceMesh in the workers "
                        "(tests/faults.py)")
    for col in ("bug", "seed", "found after", "plans to find", "shrink runs", "find + shrink", "minimal plan"):
        table.add_column(col, overflow="fold")
    for fault in ("wrong_local_rank", "slices_lose_a_rank"):
        for seed in (0, 1, 2):
            with Cluster(Topology(2, 4), deadline=10, setup=f"faults:{fault}") as cluster:
                started = time.monotonic()
                report = fuzz(cluster, 300, seed=seed, deadline=10)
                total = time.monotonic() - started
            plan = " ; ".join(report.failure.plan.describe()) if report.failure else "(not found in 300)"
            table.add_row(fault, str(seed), f"{report.time_to_failure or 0:.2f} s", str(report.examples),
                          str(report.shrink_runs), f"{total:.1f} s", plan)
    console.print(table)


def memory_section() -> None:
    from meshsim import Cluster, Plan, Topology, step

    def kib(pid: int, path: str, key: str) -> int:
        with open(f"/proc/{pid}/{path}") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1])
        return 0

    with Cluster(Topology(2, 4)) as cluster:
        cluster.run(Plan((step("init_device_mesh", shape=[2, 2, 2], names=["a", "b", "c"], out="m"),
                          step("check", mesh="m"))))
        rss = [kib(p, "status", "VmRSS:") for p in cluster.pids]
        pss = [kib(p, "smaps_rollup", "Pss:") for p in cluster.pids]
        threads = [kib(p, "status", "Threads:") for p in cluster.pids]
    table = Table(title="Worker memory at W = 8 after a plan")
    for col in ("per worker", "median", "max"):
        table.add_column(col, justify="right")
    table.add_row("RSS (MB)", f"{statistics.median(rss) / 1024:.0f}", f"{max(rss) / 1024:.0f}")
    table.add_row("PSS (MB, shared pages split)", f"{statistics.median(pss) / 1024:.0f}", f"{max(pss) / 1024:.0f}")
    table.add_row("threads", f"{statistics.median(threads):.0f}", f"{max(threads)}")
    console.print(table)


def soak_section(plans: int = 5000, every: int = 500) -> None:
    """Memory, file descriptors and threads of the controller and every worker over a long `meshsim fuzz` sweep,
    each against its value after the first 100 plans (goal: within 10 MB; fds and threads flat).
    MESHSIM_SOAK_PLANS sets the length (default 5,000)."""
    import os

    from meshsim import Cluster, Topology
    from meshsim.sweep.loop import fuzz

    plans = int(os.environ.get("MESHSIM_SOAK_PLANS", plans))

    def sample(pid: int) -> tuple[float, int, int]:
        with open(f"/proc/{pid}/status") as fh:
            fields = dict(line.split(":", 1) for line in fh)
        return int(fields["VmRSS"].split()[0]) / 1024, len(os.listdir(f"/proc/{pid}/fd")), int(fields["Threads"])

    samples: list[tuple[int, dict[int, tuple]]] = []
    with Cluster(Topology(2, 4)) as cluster:
        def on_example(report, result) -> None:
            if report.examples == 100 or report.examples % every == 0:
                time.sleep(1)  # let the ranks finish tearing the plan's groups down (their sockets and threads)
                samples.append((report.examples, {pid: sample(pid) for pid in [os.getpid(), *cluster.pids]}))

        report = fuzz(cluster, plans, seed=0, on_example=on_example)
    base: dict[int, tuple] = {}
    for _, now in samples:
        for pid, value in now.items():
            base.setdefault(pid, value)  # a worker restarted after a hang counts from its first sample
    table = Table(title=f"Soak: meshsim fuzz, {report.examples} plans at 2x4 in {report.elapsed:.0f} s "
                        f"(growth since plan 100; a worker restarted after a hang is measured from its start)")
    for col in ("after plans", "controller RSS MB", "workers RSS MB, max growth", "fds, max growth",
                "threads, max growth"):
        table.add_column(col, justify="right")
    controller = os.getpid()
    for n, now in samples:
        growth = {pid: [a - b for a, b in zip(value, base[pid])] for pid, value in now.items()}
        workers = [g for pid, g in growth.items() if pid != controller]
        table.add_row(str(n), f"{now[controller][0]:.0f} ({growth[controller][0]:+.1f})",
                      f"{max(g[0] for g in workers):+.1f}", f"{max(g[1] for g in growth.values()):+d}",
                      f"{max(g[2] for g in growth.values()):+d}")
    console.print(table)


SECTIONS = {"start": start_section, "launch": lambda: launch_section(console), "plans": plans_section,
            "fuzz": fuzz_section, "dtensor": dtensor_section, "sweep": sweep_section, "find": find_section,
            "memory": memory_section, "tiers": lambda: tiers_section(), "soak": soak_section}


def tiers_section() -> None:
    """The thread, fake and model sections of `python -m bench`."""
    import fake
    import model
    import thread
    from figures import table

    for name, section in (("thread tier", thread), ("fake tier", fake), ("model tier", model)):
        console.print(table(section.run(), name))

if __name__ == "__main__":
    sys.path[:0] = [HERE, TESTS]  # before the first cluster: its workers import from both
    for name in sys.argv[1:] or list(SECTIONS):
        SECTIONS[name]()
