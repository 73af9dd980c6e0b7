"""Controller memory over a long sweep: `meshsim fuzz` on a 2x4 process cluster for 5,000 generated plans, the
controller's RSS sampled every 500 (after a garbage collection), each against its value once the sweep has warmed
up (plan 500): it must stay flat, so nothing is kept per plan."""

from __future__ import annotations

import gc
import os

from figures import Figure, goal


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run(quick: bool = False) -> list[Figure]:
    from meshsim import Cluster, Topology
    from meshsim.sweep.loop import fuzz

    plans = int(os.environ.get("MESHSIM_SOAK_PLANS", 1000 if quick else 5000))
    every = max(1, plans // 10)
    samples: list[tuple[int, float]] = []

    def on_example(report, result) -> None:  # noqa: ANN001
        if report.examples % every == 0 and not report.shrink_runs:
            gc.collect()
            samples.append((report.examples, rss_mb(os.getpid())))

    with Cluster(Topology(2, 4)) as cluster:
        report = fuzz(cluster, plans, seed=0, on_example=on_example)
    base = samples[0][1]
    growth = [mb - base for _, mb in samples]
    worst = max(growth, key=abs)
    trail = ", ".join(f"{n}: {mb - base:+.1f}" for n, mb in samples)
    figure = Figure("memory", f"controller RSS growth over {report.examples:,} plans (fuzz, 2x4)", worst, "MB",
                    base, f"RSS after {samples[0][0]} plans", ratio=None,
                    note=f"MB since plan {samples[0][0]} at each sample: {trail}")
    return [goal(figure, lambda f: abs(f.value) <= 5.0, "flat within +-5 MB")]
