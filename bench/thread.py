"""Thread tier: plans per second at W = 64, (4,4,4) + check, next to the same torch calls as threads on torch's
threaded process group (alternating rounds, medians); and a 512-rank plan at the tier's default deadline (no
false hang), next to the raw threaded loop doing the same plan."""

from __future__ import annotations

import statistics
import time

from figures import Figure, goal
from raw import threaded_loop


def _plan(shape: tuple[int, ...], names: tuple[str, ...]):  # noqa: ANN202
    from meshsim import Plan, step

    return Plan((step("init_device_mesh", out="m", shape=list(shape), names=list(names)), step("check", mesh="m")))


def run(quick: bool = False) -> list[Figure]:
    from meshsim import Cluster, Topology

    # Many short rounds, each side first in turn: on 2 shared cores the load moves within seconds, and a ratio taken
    # over 3 long rounds swung from 0.4 to 1.2 between runs of the same code; the median of more pairs holds still.
    count, rounds = (4, 2) if quick else (4, 7)
    shape, names = (4, 4, 4), ("a", "b", "c")
    plan = _plan(shape, names)
    ours, raws = [], []

    def ours_round() -> None:
        started = time.monotonic()
        for _ in range(count):
            assert cluster.run(plan).passed
        ours.append(count / (time.monotonic() - started))

    with Cluster(Topology(8, 8), tier="thread") as cluster:
        cluster.run(plan)
        for number in range(rounds):
            if number % 2:
                raws.append(threaded_loop(64, count, shape, names))
                ours_round()
            else:
                ours_round()
                raws.append(threaded_loop(64, count, shape, names))
    ratios = [a / b for a, b in zip(ours, raws)]
    figures = [goal(Figure("thread", "plans/s at W=64, (4,4,4) + check", statistics.median(ours), "plans/s",
                           statistics.median(raws), "torch's threaded group, raw loop",
                           ratio=statistics.median(ratios),
                           note=f"{rounds} rounds x {count} plans; ratios " + ", ".join(f"{r:.2f}" for r in ratios)),
                    lambda f: (f.ratio or 0) >= 0.8, ">= 0.8x raw")]
    if not quick:
        figures.append(_large())
    return figures


def _large() -> Figure:
    """One (8,8,8) plan with a check at 512 thread ranks, at the default deadline for that world."""
    from meshsim import Cluster, Topology

    big = _plan((8, 8, 8), ("a", "b", "c"))
    with Cluster(Topology(64, 8), tier="thread") as cluster:
        started = time.monotonic()
        result = cluster.run(big)
        seconds = time.monotonic() - started
        deadline = cluster.deadline
    raw = 1 / threaded_loop(512, 1, (8, 8, 8), ("a", "b", "c"))
    figure = Figure("thread", "512 ranks, (8,8,8) + check, one plan", seconds, "s", raw, "raw threaded loop",
                    note=f"outcome {result.outcome} at the default deadline {deadline:.0f} s")
    return goal(figure, lambda f: result.passed, "passes at the default deadline (no false hang)")
