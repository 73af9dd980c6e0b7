"""Property sweeps: generated plans on one persistent cluster, shrunk to a minimal counterexample."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from . import deadlines
from .check import check, prediction_for
from .errors import ClusterError
from .model import torch_side
from .outcome import HANG, PASS, UNDEFINED
from .scenario import Expect, Scenario
from .spec.topology import Topology
from .strategies import divergent_plans, plans
from .testing import Disagreement


@dataclass
class FuzzReport:
    topology: Topology
    examples: int = 0  # plans generated and run (shrinking not counted)
    shrink_runs: int = 0
    elapsed: float = 0.0
    outcomes: Counter = field(default_factory=Counter)
    findings: Counter = field(default_factory=Counter)
    failure: Any = None  # the minimal failing Result
    saved: Path | None = None
    time_to_failure: float | None = None
    notes: list[str] = field(default_factory=list)  # what the tier could not check (each note once)
    ops: Counter = field(default_factory=Counter)  # how often each operation was drawn
    pairs: Counter = field(default_factory=Counter)  # ... and each pair of consecutive operations
    reach: Any = None  # meshsim.torch_coverage.Reach, when measured
    replayed_on: str | None = None  # the smaller world and tier that still shows the failure, if any

    @property
    def passed(self) -> bool:
        return self.failure is None

    @property
    def rate(self) -> float:
        return self.examples / self.elapsed if self.elapsed else 0.0

    def to_json(self) -> dict:
        return {"topology": str(self.topology), "examples": self.examples, "shrink_runs": self.shrink_runs,
                "elapsed_s": round(self.elapsed, 2), "examples_per_s": round(self.rate, 2), "passed": self.passed,
                "outcomes": dict(self.outcomes), "findings": dict(self.findings), "ops": dict(self.ops),
                "pairs": {f"{a} -> {b}": n for (a, b), n in self.pairs.most_common()},
                "torch_coverage": self.reach.to_json() if self.reach is not None else None,
                "failure": self.failure.to_json() if self.failure is not None else None,
                "saved": str(self.saved) if self.saved else None}


class Interrupted(BaseException):
    """The cluster cannot go on (a setup that fails): ends the sweep at once, past Hypothesis' replay."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


# Hypothesis keeps every example of a run in its own bookkeeping (about 20 KB each with these plans), so a long
# sweep runs as consecutive Hypothesis runs of at most this many examples (about 4 MB); memory stays flat
# across them.
CHUNK = 200


def fuzz(cluster: Any, examples: int, seed: int | None = None, deadline: float | None = None,
         max_steps: int = 6, divergent: bool = False, strict: bool = False, save_dir: str | Path | None = None,
         on_example: Callable[[FuzzReport, Any], None] | None = None,
         expected_hang_deadline: float | None = None) -> FuzzReport:
    """Run `examples` generated plans; stop at the first disagreement and shrink it.

    Where the model predicts that torch hangs (or races), the plan gets a shorter deadline: waiting the full
    deadline would only confirm the prediction more slowly.
    """
    report = FuzzReport(cluster.topology)
    world = cluster.world
    tier = getattr(cluster, "tier", "process")
    deadline = deadline if deadline is not None else getattr(cluster, "deadline", None) or deadlines.plan(tier, world)
    if expected_hang_deadline is None:
        expected_hang_deadline = deadlines.expected_hang(tier, world)
    strategy = plans(world, max_steps=max_steps, device=cluster.platform.device)
    if divergent:
        strategy = st.one_of(strategy, divergent_plans(world))
    started = time.monotonic()

    def torch_agrees_with_model(plan: Any) -> None:
        prediction = prediction_for(plan, world, deadline, cluster.platform, getattr(cluster, "by_class", False))
        wait = deadline
        if torch_side(prediction.outcome) in (HANG, UNDEFINED):
            wait = min(deadline, expected_hang_deadline)
        try:
            result = check(cluster, plan, wait, strict=strict, prediction=prediction)
        except ClusterError as exc:
            raise Interrupted(exc) from None
        shrinking = report.time_to_failure is not None  # set at the first disagreement
        if shrinking:
            report.shrink_runs += 1
        else:
            report.examples += 1
            report.outcomes[result.outcome] += 1
            ops = [s.op for s in plan.steps]
            report.ops.update(ops)
            report.pairs.update(zip(ops, ops[1:]))
            for fid in result.findings:
                report.findings[fid] += 1
            report.notes.extend(n for n in result.notes if n not in report.notes)
        if on_example is not None:
            on_example(report, result)
        if not result.passed:
            if not shrinking:
                report.time_to_failure = time.monotonic() - started
            raise Disagreement(result)

    for chunk, count in enumerate(_chunks(examples)):
        run = settings(max_examples=count, deadline=None, database=None, report_multiple_bugs=False,
                       phases=[Phase.generate, Phase.shrink], print_blob=False,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])(
            given(strategy)(torch_agrees_with_model))
        if seed is not None:
            run = hypothesis_seed(seed if chunk == 0 else hash((seed, chunk)))(run)  # new plans, reproducibly
        try:
            run()
        except Disagreement as exc:
            report.failure = exc.result  # Hypothesis re-runs the minimal example last
            break
        except Interrupted as exc:
            raise exc.error from None
    report.elapsed = time.monotonic() - started
    topology = cluster.topology
    if report.failure is not None and getattr(cluster, "tier", "process") != "process":
        smaller = shrink_world(report.failure.plan, topology, deadline, strict)
        if smaller is not None:
            topology, report.failure, report.replayed_on = smaller
    if report.failure is not None and save_dir is not None:
        report.saved = save_counterexample(report.failure, topology, deadline, seed, save_dir)
    return report


def _chunks(examples: int) -> list[int]:
    return [min(CHUNK, examples - start) for start in range(0, examples, CHUNK)]


def shrink_world(plan: Any, topology: Topology, deadline: float, strict: bool) -> tuple[Topology, Any, str] | None:
    """A failure found on a large tier, tried on the smallest world that holds its plan (same devices per host),
    on the process tier when it fits there, else the thread tier. Returns (topology, result, words) when the
    failure still shows there, else None (the large world is then needed)."""
    from .ops import validate
    from .spec.plan import PlanError
    from .tiers import open_executor

    d = topology.devices_per_host
    for hosts in range(1, topology.hosts):
        small = Topology(hosts, d)
        try:
            validate(plan, small.world)
        except PlanError:
            continue
        tier = "process" if small.world <= 16 else "thread" if small.world <= 1024 else None
        if tier is None:
            return None
        try:
            with open_executor(small, tier, deadline=deadline) as executor:
                result = check(executor, plan, deadline, strict=strict)
        except ClusterError:
            return None
        if not result.passed:
            return small, result, f"{small} on the {tier} tier"
        return None
    return None


def save_counterexample(result: Any, topology: Topology, deadline: float, seed: int | None,
                        save_dir: str | Path) -> Path:
    """Write the failing plan as a scenario that `meshsim run` replays (it fails while the bug is there)."""
    digest = hashlib.sha1(result.plan.to_json().encode()).hexdigest()[:8]
    expected = result.expected if isinstance(result.expected, str) else result.expected.right
    if expected == UNDEFINED:
        expected = PASS
    scenario = Scenario(
        name=f"fuzz-{digest}",
        topology=topology,
        plan=result.plan,
        deadline=deadline,
        expect=Expect(outcome=expected),
        description=(f"Found by `meshsim fuzz` (seed {seed}): torch ended {result.outcome} and disagreed with the "
                     f"model in {len(result.differences)} places. Replays with `meshsim run`."),
    )
    return scenario.save(Path(save_dir) / f"{scenario.name}.toml")
