"""Fake tier: every rank of 4,096 and of 16,384 checked (each rank alone on torch's fake process group, two
workers), next to torch's own calls for a rank in one process, extrapolated to the world; and the cost per rank at
both sizes, which should not grow with the world beyond what torch's own calls do."""

from __future__ import annotations

import time

from figures import Figure, goal
from raw import fake_per_rank

CASES = (((8, 8, 8, 8), 512, 45.0), ((16, 16, 8, 8), 2048, 300.0))  # shape, hosts of 8, goal in seconds


def run(quick: bool = False) -> list[Figure]:
    from meshsim import Cluster, Plan, Topology, step

    figures, per_rank = [], {}
    for shape, hosts, limit in CASES:
        topology = Topology(hosts, 8)
        sample = 512 if quick else None
        plan = Plan((step("init_device_mesh", out="m", shape=list(shape), names=list("abcd")),
                     step("check", mesh="m")))
        with Cluster(topology, tier="fake", ranks=sample) as cluster:
            started = time.monotonic()
            result = cluster.run(plan)
            seconds = time.monotonic() - started
            workers = cluster.workers
        assert result.passed, result.differences[:1]
        checked = sample or topology.world
        raw = fake_per_rank(topology.world, shape, 64)
        ours = seconds * workers / checked
        per_rank[topology.world] = (ours, raw)
        what = f"{checked:,} of {topology.world:,} ranks" if sample else f"every rank of {topology.world:,}"
        figures.append(goal(Figure("fake", f"{what}, {shape} + check", seconds, "s", raw * checked / workers,
                                   f"torch's own calls, {workers} processes, extrapolated"),
                            lambda f, n=limit * checked / topology.world: f.value <= n,
                            f"<= {limit * checked / topology.world:.0f} s"))
    (small, small_raw), (large, large_raw) = per_rank.values()
    growth = Figure("fake", "cost per rank, 16,384 over 4,096", large / small, "x", large_raw / small_raw,
                    "torch's own calls, same sizes", note=f"{small * 1000:.1f} -> {large * 1000:.1f} ms a rank")
    figures.append(goal(growth, lambda f: (f.ratio or 9) <= 1.25, "flat: grows no more than torch's own (<= 1.25x)"))
    return figures
