"""Process tier: plans per second at W = 8 (2 hosts x 4), next to the same torch calls in a raw loop on persistent
gloo processes, in alternating rounds (medians)."""

from __future__ import annotations

import statistics
import time

from figures import Figure, goal
from raw import process_loop

SHAPES = [((2, 4), ("dp", "tp")), ((2, 2, 2), ("dp", "cp", "tp"))]


def run(quick: bool = False) -> list[Figure]:
    from meshsim import Cluster, Plan, Topology, step

    count, rounds = (20, 2) if quick else (60, 5)
    plans = [Plan((step("init_device_mesh", shape=list(s), names=list(n), out="m"), step("check", mesh="m")))
             for s, n in SHAPES]
    raw_plans = [SHAPES[i % 2] for i in range(count)]
    ours, raws = [], []
    with Cluster(Topology(2, 4)) as cluster:
        for p in plans:  # both shapes warm
            cluster.run(p)
        for _ in range(rounds):
            started = time.monotonic()
            for i in range(count):
                assert cluster.run(plans[i % 2]).passed
            ours.append(count / (time.monotonic() - started))
            raws.append(process_loop(8, raw_plans))
    ratios = [a / b for a, b in zip(ours, raws)]
    figure = Figure("process", "plans/s at W=8, (2,4)/(2,2,2) + check", statistics.median(ours), "plans/s",
                    statistics.median(raws), "raw torch loop", ratio=statistics.median(ratios),
                    note=f"{rounds} rounds x {count} plans, alternating; ratios "
                         + ", ".join(f"{r:.2f}" for r in ratios))
    return [goal(figure, lambda f: (f.ratio or 0) >= 0.95, ">= 0.95x raw")]
