"""Sweep section: the property sweep users run (`meshsim fuzz --hosts 2 --devices-per-host 4`), at W = 8.

Marginal examples/s (with and without DTensor steps) and collective steps checked/s, next to the raw torch loop of
bench/process.py measured in the same run; and how long a default sweep (400 examples) takes to reach, then to shrink,
each seeded bug of tests/faults.py that bench/bench.py's `_seeded_bugs` injects.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from figures import Figure, goal
from process import SHAPES
from raw import process_loop

SEED, SHORT, LONG = 3, 20, 120
README_EXAMPLES = 200  # the README's first command
BUG_EXAMPLES, BUG_SEED = 400, 1  # the CLI's default seed is random: a fixed one keeps runs comparable
# The bugs bench/bench.py's _seeded_bugs injects with Cluster(setup="faults:NAME") (each rank runs it after joining).
# tests/faults.py's other two are left out: one hangs every gather on purpose (shrink-budget tests), the other
# only changes how many collectives a step issues, which the fake tier sees and a process sweep cannot.
BUGS = ("outer_shard_to_shard_flipped", "partials_reduced_on_one_dim", "outer_reduce_scatter_rolled",
        "uneven_gather_drops_last", "concatenate_reverses_dims", "unflatten_swaps_sizes", "slices_lose_a_rank",
        "wrong_local_rank")
QUICK_BUGS = ("outer_shard_to_shard_flipped", "wrong_local_rank")  # one DTensor bug, one DeviceMesh bug
# What bench/bench.py's dtensor_section removes from the draws: the DTensor ops and the "dtensor" chain move.
DTENSOR_OPS = ("distribute", "redistribute", "full_tensor", "to_local", "from_local", "sum", "dtensor")


def run(quick: bool = False) -> list[Figure]:
    from meshsim import Cluster, Topology

    with Cluster(Topology(2, 4)) as cluster:
        job = _fuzz(cluster, README_EXAMPLES)  # the README's main job: the first sweep of a new cluster
        full = _marginal(cluster, reuse=False)
        reused = _marginal(cluster, reuse=True)
        with _without_dtensor():
            bare = _marginal(cluster, reuse=False)
    # the anchor runs after the cluster is closed, so its eight idle ranks do not share the two cores with it
    raw_plans = [SHAPES[i % 2] for i in range(20 if quick else 60)]
    raw = process_loop(8, raw_plans)
    figures = [_job_figure(job),
               _rate_figure("examples/s at W=8, marginal 20 -> 120, matrix run in every sweep", full, raw,
                            len(raw_plans)),
               _rate_figure("examples/s at W=8, marginal 20 -> 120, matrix passed earlier on the cluster", reused,
                            raw, len(raw_plans)),
               _rate_figure("examples/s at W=8 without DTensor steps, marginal 20 -> 120", bare, raw,
                            len(raw_plans), bare=True),
               _collectives_figure(full, raw, raw_plans)]
    return figures + _bug_figures(QUICK_BUGS if quick else BUGS)


def _job_figure(job: tuple[Any, float, list[float]]) -> Figure:
    report, seconds, _ = job
    note = (f"fuzz({README_EXAMPLES}, seed {SEED}) as `meshsim fuzz --hosts 2 --devices-per-host 4 --examples "
            f"{README_EXAMPLES}` runs it: the first sweep on a new cluster (started before the clock, the matrix "
            f"run, not reused); {report.examples} examples, agrees: {report.passed}")
    figure = Figure("sweep", f"README main job: {README_EXAMPLES} examples at W=8 on a new cluster", seconds, "s",
                    README_EXAMPLES / seconds, "examples/s", note=note)
    return goal(figure, lambda f: f.value <= 10, "<= 10 s")


# --------------------------------------------------------------------------------------------- rate


def _fuzz(cluster: Any, examples: int, seed: int = SEED) -> tuple[Any, float, list[float]]:
    """One fresh fuzz call: its report, the wall seconds around it (what a user waits), and when each example
    (not shrink run) ended."""
    from meshsim.sweep import fuzz

    ended: list[float] = []

    def on_example(report: Any, result: Any) -> None:
        if report.shrinking.started is None:
            ended.append(time.monotonic())

    started = time.monotonic()
    report = fuzz(cluster, examples, seed=seed, on_example=on_example)
    return report, time.monotonic() - started, ended


def _marginal(cluster: Any, reuse: bool) -> dict[str, Any]:
    """(n120 - n20) / (t120 - t20): the fixed cost of a call (Hypothesis' setup, the spare rank) cancels out.
    Also the rate of the 120-example run's generated plans alone, from when each example ended. `reuse`: the
    matrix plans the cluster passed before count without running again (what a sweep does in a pytest session);
    otherwise every sweep runs them, as each `meshsim fuzz` command does."""
    from meshsim.check import passed_here
    from meshsim.sweep import matrix_plans

    if reuse:
        _fuzz(cluster, LONG)  # every matrix plan passed on this cluster
    else:
        passed_here(cluster).clear()
    short, t_short, _ = _fuzz(cluster, SHORT)
    if not reuse:
        passed_here(cluster).clear()
    long, t_long, ended = _fuzz(cluster, LONG)
    matrix = len(matrix_plans(cluster.world))
    generated = (len(ended) - matrix) / (ended[-1] - ended[matrix - 1]) if len(ended) > matrix + 1 else math.nan
    return {"rate": (long.examples - short.examples) / max(t_long - t_short, 1e-9), "short": short, "long": long,
            "t_short": t_short, "t_long": t_long, "matrix": matrix, "generated": generated, "reuse": reuse}


@contextmanager
def _without_dtensor() -> Iterator[None]:
    """Neither fuzz nor plans() has a switch for DTensor steps (fuzz's runs_dtensor is the tier's capability and
    only decides whether the matrix plans run): the draws lose them through strategies.WEIGHTS, as in
    bench/bench.py, and get them back after."""
    from meshsim.sweep import strategies

    saved = dict(strategies.WEIGHTS)
    try:
        for op in DTENSOR_OPS:
            strategies.WEIGHTS.pop(op, None)
        yield
    finally:
        strategies.WEIGHTS.clear()
        strategies.WEIGHTS.update(saved)


def _rate_figure(name: str, m: dict[str, Any], raw: float, raw_count: int, bare: bool = False) -> Figure:
    short, long, matrix = m["short"], m["long"], m["matrix"]
    counted = (f"report.examples {short.examples} in {m['t_short']:.1f} s and {long.examples} in {m['t_long']:.1f} s "
               f"(seed {SEED}, one cluster; wall time around each call); examples count the matrix plans, which run "
               f"first ({min(matrix, SHORT - 1)} of the 20, all {matrix} of the 120), not shrink runs, so the "
               f"marginal {long.examples - short.examples} are {matrix - min(matrix, SHORT - 1)} matrix plans and "
               f"the rest generated; generated plans alone in the 120-run: {m['generated']:.1f}/s")
    if m["reuse"]:
        counted += "; the matrix plans had passed on this cluster in an earlier sweep: counted, not run again"
    if bare:
        counted += "; DTensor ops and chains taken out of the draws, the matrix plans (DTensor-heavy) still run"
    if not long.passed:
        counted += "; the sweep disagreed with the model: " + " ; ".join(long.failure.plan.describe())
    counted += (f"; anchor: bench/process.py's raw loop, {raw_count} plans of init_device_mesh (2,4)/(2,2,2) + "
                f"check's collectives on 8 gloo processes, not the sweep's plans (longer, with DTensor steps)")
    figure = Figure("sweep", name, m["rate"], "examples/s", raw, "raw torch loop, plans/s", note=counted)
    return goal(figure, lambda f: f.value >= 25, ">= 25/s")


def _collectives_figure(m: dict[str, Any], raw: float, raw_plans: list) -> Figure:
    """The report counts each drawn operation (report.ops); collectives are the ops of role "collective"."""
    from meshsim.ops import OPERATIONS

    names = sorted(op.name for op in OPERATIONS.values() if op.role == "collective")
    long = m["long"]
    steps = sum(long.ops[n] for n in names)
    # the raw loop's check issues all_reduce, all_gather and broadcast per mesh dim, then one barrier per plan
    per_plan = statistics.mean(3 * len(shape) + 1 for shape, _ in raw_plans)
    note = (f"{steps} collective steps ({', '.join(names)}) in the {long.examples} examples of the 120-run over its "
            f"{m['t_long']:.1f} s; counted from report.ops, which counts steps as drawn, not the collectives that "
            f"check, DTensor and derived-mesh steps issue inside torch (so this undercounts); anchor: raw plans/s x "
            f"{per_plan:g} collective calls a plan")
    return Figure("sweep", "collective steps checked/s at W=8 (120 examples)", steps / m["t_long"], "calls/s",
                  raw * per_plan, "raw torch loop, collective calls/s", note=note)


# --------------------------------------------------------------------------------------------- bugs


def _time_to_bug(fault: str) -> dict[str, Any]:
    """A default sweep (400 examples, W = 8, default deadline and shrink budget) with the bug in every rank:
    seconds from the call to the first failing example (report.time_to_failure) and to fuzz returning with the
    shrunk counterexample. The cluster's start is not counted."""
    from meshsim import Cluster, Topology

    with Cluster(Topology(2, 4), setup=f"faults:{fault}") as cluster:
        report, shrunk, _ = _fuzz(cluster, BUG_EXAMPLES, seed=BUG_SEED)
    if report.passed:
        return {"fault": fault, "first": math.inf, "shrunk": math.inf, "text": f"{fault} not caught in 400"}
    text = (f"{fault} {report.time_to_failure:.1f}/{shrunk:.1f} s (example {report.examples}, "
            f"{report.shrink_runs} shrink runs, {len(report.failure.plan.steps)} steps)")
    return {"fault": fault, "first": report.time_to_failure, "shrunk": shrunk, "text": text}


def _bug_figures(faults: tuple[str, ...]) -> list[Figure]:
    found = [_time_to_bug(f) for f in faults]
    first = [b["first"] for b in found]
    shrunk = [b["shrunk"] for b in found]
    each = (f"{len(found)} bugs, seed {BUG_SEED}; first failing / shrunk: " + "; ".join(b["text"] for b in found))
    median = Figure("sweep", f"time to a seeded bug, shrunk: median of {len(found)}", statistics.median(shrunk), "s",
                    statistics.median(first), "to the first failing example", note=each)
    slowest = max(found, key=lambda b: b["shrunk"])
    worst = Figure("sweep", f"time to a seeded bug, shrunk: max of {len(found)}", max(shrunk), "s", max(first),
                   "to the first failing example", note=f"slowest: {slowest['fault']}; {each}")
    return [goal(median, lambda f: f.value <= 10, "median <= 10 s"),
            goal(worst, lambda f: f.value <= 60, "each <= 60 s")]
