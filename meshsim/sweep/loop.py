"""Property sweeps: generated plans on one persistent cluster, shrunk to a minimal counterexample."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure

from ..check import check, passed_here
from ..core import deadlines
from ..core.errors import ClusterError
from ..core.outcome import HANG, PASS, UNDEFINED
from ..model import torch_side
from ..scenario.files import Expect, Scenario, raising_steps
from ..spec.plan import Plan
from ..spec.tiers import capabilities
from ..spec.topology import Topology
from .produced import Produced
from .properties import Disagreement
from .strategies import divergent_plans, matrix_plans, plans


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
    produced: Produced = field(default_factory=Produced)  # derived meshes and transforms produced, then checked
    reach: Any = None  # meshsim.sweep.coverage.Reach, when measured
    replayed_on: str | None = None  # the smaller world and tier that still shows the failure, if any
    shrinking: Any = None  # Shrinking, once fuzz runs

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
                "produced": self.produced.to_json(),
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


@dataclass
class Shrinking:
    """The shrink phase, bounded: it starts at the first disagreement and stops running plans after `budget`
    seconds (the smallest failing plan so far stands). A plan that hung is shrunk with the deadline of a plan
    the model says must hang (`hang_wait`): a candidate that still hangs shows it in that time, and the smallest
    is confirmed with the full deadline at the end."""

    budget: float
    started: float | None = None
    first: Any = None  # the first failing verdict
    hang_wait: float | None = None
    failures: dict[str, Any] = field(default_factory=dict)  # plan (JSON) -> its failing verdict

    def begin(self, result: Any, hang_wait: float) -> None:
        self.started, self.first = time.monotonic(), result
        if result.outcome == HANG and torch_side(result.expected) != HANG:
            self.hang_wait = hang_wait

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started if self.started is not None else 0.0

    def exhausted(self) -> bool:
        return self.started is not None and self.elapsed > self.budget

    @property
    def smallest(self) -> int | None:
        return min((len(r.plan.steps) for r in self.failures.values()), default=None)


def fuzz(cluster: Any, examples: int, seed: int | None = None, deadline: float | None = None,
         max_steps: int = 6, divergent: bool = False, strict: bool = False, save_dir: str | Path | None = None,
         on_example: Callable[[FuzzReport, Any], None] | None = None,
         expected_hang_deadline: float | None = None,
         shrink_budget: float = deadlines.SHRINK_S) -> FuzzReport:
    """Run `examples` plans: the matrix plans first (every redistribute cell, every derived mesh kind), then
    generated ones; stop at the first disagreement and shrink it (within `shrink_budget`).

    Where the model predicts that torch hangs (or races), the plan gets a shorter deadline: waiting the full
    deadline would only confirm the prediction more slowly.
    """
    tier = getattr(cluster, "tier", "process")
    if deadline is None:
        deadline = getattr(cluster, "deadline", None) or deadlines.plan(tier, cluster.world)
    if expected_hang_deadline is None:
        expected_hang_deadline = deadlines.expected_hang(tier, cluster.world)
    runs_dtensor = capabilities(tier).dtensor
    first = matrix_plans(cluster.world)[:max(0, examples - 1)] if runs_dtensor and cluster.world > 1 else []
    sweep = _Sweep(cluster, deadline, strict, expected_hang_deadline, shrink_budget, on_example, first)
    report = sweep.report
    # No spare generation is started here: eight ranks booting beside the sweep's first plans slowed them, and a
    # sweep that meets no hang never uses it. The first plan the model says hangs starts one while it hangs
    # (meshsim.run.process); a hang the model did not foresee waits for fresh ranks once.
    strategy = plans(sweep.world, max_steps=max_steps, device=cluster.platform.device,
                     platform=cluster.platform)
    if divergent:
        strategy = st.one_of(strategy, divergent_plans(sweep.world))
    for chunk, count in enumerate(_chunks(examples - len(first))):  # the matrix plans count among the examples
        test = given(strategy)(sweep.torch_agrees_with_model)
        for plan in first if chunk == 0 else []:  # run first: every cell of the matrix, every derived mesh
            test = example(plan)(test)
        run = settings(max_examples=count, deadline=None,
                       database=None, report_multiple_bugs=False,
                       phases=[Phase.explicit, Phase.generate, Phase.shrink], print_blob=False,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])(test)
        if seed is not None:
            run = hypothesis_seed(seed if chunk == 0 else hash((seed, chunk)))(run)  # new plans, reproducibly
        try:
            run()
        except Disagreement as exc:
            report.failure = exc.result  # Hypothesis re-runs the minimal example last
            break
        except FlakyFailure as exc:  # the minimal example passed when replayed: report the failure as seen
            report.failure = _disagreement_in(exc) or report.shrinking.first
            report.notes.append("the failure did not repeat when replayed (flaky): it is reported as first seen")
            break
        except Interrupted as exc:
            raise exc.error from None
    if report.failure is not None and report.failure.plan in first:  # Hypothesis does not shrink explicit ones
        report.failure = sweep.shrink_steps(report.failure)
    report.elapsed = time.monotonic() - sweep.started
    if sweep.reused:
        report.notes.append(f"{sweep.reused} of the {len(first)} matrix plans passed on this cluster earlier in this "
                            f"process (same torch, deadline and strictness): counted as passed, not run again")
    _settle(report, cluster, deadline, strict)
    topology = cluster.topology
    if report.failure is not None and getattr(cluster, "tier", "process") != "process":
        smaller = shrink_world(report.failure.plan, topology, deadline, strict)
        if smaller is not None:
            topology, report.failure, report.replayed_on = smaller
    if report.failure is not None and save_dir is not None:
        report.saved = save_counterexample(report.failure, topology, deadline, seed, save_dir)
    return report


class _Sweep:
    """One sweep on one cluster: runs a plan against the model (counting it in the report), and shrinks."""

    def __init__(self, cluster: Any, deadline: float, strict: bool, expected_hang_deadline: float,
                 shrink_budget: float, on_example: Callable[[FuzzReport, Any], None] | None, matrix: list[Plan]):
        self.cluster, self.world, self.deadline, self.strict = cluster, cluster.world, deadline, strict
        self.expected_hang_deadline, self.on_example = expected_hang_deadline, on_example
        self.report = FuzzReport(cluster.topology)
        self.report.shrinking = self.shrink = Shrinking(shrink_budget)
        self.started = time.monotonic()
        # The matrix is the same in every sweep: a cluster that passed a matrix plan (a pytest session's, the
        # bench's) need not run it again in the next sweep. Generated plans always run, and every plan runs where
        # the ranks measure torch's coverage (what a plan reaches is the point there).
        measured = getattr(cluster, "coverage_dir", None) is not None
        self.matrix = set() if measured else {plan.to_json() for plan in matrix}
        self.passed = passed_here(cluster)
        self.reused = 0

    def attempt(self, plan: Any) -> Any:
        """Run `plan` against the model (it predicts while the ranks run), count it, and remember it when it fails.
        A plan the model says hangs gets the shorter deadline; while a hang is shrunk, every candidate does."""
        shrink = self.shrink
        cluster = self.cluster
        wait = deadlines.for_plan(getattr(cluster, "tier", "process"), cluster.world, len(plan), self.deadline) \
            if shrink.hang_wait is None else min(self.deadline, shrink.hang_wait)
        text = plan.to_json()
        key = (text, wait, self.strict) if text in self.matrix else None
        result = self.passed.get(key) if key is not None else None
        if result is not None:
            self.reused += 1
        else:
            try:
                result = check(self.cluster, plan, wait, strict=self.strict,
                               hang_deadline=self.expected_hang_deadline,
                               hangs=True if shrink.hang_wait is not None else None)
            except ClusterError as exc:
                raise Interrupted(exc) from None
            if key is not None and result.passed:
                self.passed[key] = result
        _count(self.report, plan, result)
        if self.on_example is not None:
            self.on_example(self.report, result)
        if not result.passed:
            if shrink.started is None:
                self.report.time_to_failure = time.monotonic() - self.started
                shrink.begin(result, self.expected_hang_deadline)
            shrink.failures[text] = result
        return result

    def torch_agrees_with_model(self, plan: Any) -> None:
        """Hypothesis' test: a Disagreement unless torch agrees (past the shrink budget, plans no longer run:
        only failures already seen fail again)."""
        if self.shrink.exhausted():
            seen = self.shrink.failures.get(plan.to_json())
            if seen is not None:
                raise Disagreement(seen)
            return
        result = self.attempt(plan)
        if not result.passed:
            raise Disagreement(result)

    def shrink_steps(self, failure: Any) -> Any:
        """A failing plan made smaller by dropping runs of steps while it still fails (halves first, then quarters,
        down to single steps: a matrix plan of sixty steps shrinks in tens of runs, not hundreds), skipping
        candidates that no longer validate, within the shrink budget."""
        from ..ops import validate
        from ..spec.plan import Plan, PlanError

        size = max(1, len(failure.plan.steps) // 2)
        while not self.shrink.exhausted():
            improved = False
            start = len(failure.plan.steps) - size
            while start > -size and not self.shrink.exhausted():
                steps = failure.plan.steps
                candidate = Plan(steps[:max(0, start)] + steps[start + size:])
                start -= size
                try:
                    validate(candidate, self.world)
                except PlanError:
                    continue
                result = self.attempt(candidate)
                if not result.passed:
                    failure, improved = result, True
            if size == 1 and not improved:
                break
            size = max(1, size // 2) if not improved else size
        return failure


def _count(report: FuzzReport, plan: Any, result: Any) -> None:
    """One run in the report: a generated example (its outcome, what it drew, produced and exercised), or one
    more run of the shrink phase."""
    if report.shrinking.started is not None:
        report.shrink_runs += 1
        return
    report.examples += 1
    report.outcomes[result.outcome] += 1
    ops = [s.op for s in plan.steps]
    report.ops.update(ops)
    report.pairs.update(zip(ops, ops[1:]))
    for fid in result.findings:
        report.findings[fid] += 1
    if result.passed:
        report.produced.add(plan, result.record)
    report.notes.extend(n for n in result.notes if n not in report.notes)


def _disagreement_in(group: BaseException) -> Any:
    for exc in getattr(group, "exceptions", ()):
        if isinstance(exc, Disagreement):
            return exc.result
        found = _disagreement_in(exc)
        if found is not None:
            return found
    return None


def _settle(report: FuzzReport, cluster: Any, deadline: float, strict: bool) -> None:
    """Say where shrinking stopped, and confirm a hang shrunk with the short deadline under the full one."""
    shrink = report.shrinking
    if report.failure is None:
        return
    if shrink.exhausted():
        report.notes.append(f"shrinking stopped at its budget of {shrink.budget:g} s: the smallest failing plan "
                            "so far is reported")
    if shrink.hang_wait is not None and report.failure is not shrink.first:
        confirmed = check(cluster, report.failure.plan, deadline, strict=strict)
        if confirmed.passed:
            report.notes.append(f"the smallest plan that hung within {shrink.hang_wait:g} s finished within "
                                f"{deadline:g} s: the first failing plan is reported")
            report.failure = shrink.first
        else:
            report.failure = confirmed


def _chunks(examples: int) -> list[int]:
    return [min(CHUNK, examples - start) for start in range(0, examples, CHUNK)]


def shrink_world(plan: Any, topology: Topology, deadline: float, strict: bool) -> tuple[Topology, Any, str] | None:
    """A failure found on a large tier, tried on the smallest world that holds its plan (same devices per host),
    on the process tier when it fits there, else the thread tier. Returns (topology, result, words) when the
    failure still shows there, else None (the large world is then needed)."""
    from ..ops import validate
    from ..run.tiers import open_executor
    from ..spec.plan import PlanError

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
    plan = result.plan
    if result.prediction is not None and result.prediction.model_error is None:  # the errors the plan means
        meant = raising_steps(plan, result.prediction, topology.world)
        plan = Plan(tuple(replace(st, expect_error=True) if i in meant else st for i, st in enumerate(plan.steps)))
    scenario = Scenario(
        name=f"fuzz-{digest}",
        topology=topology,
        plan=plan,
        deadline=deadline,
        expect=Expect(outcome=expected),
        description=(f"Found by `meshsim fuzz` (seed {seed}): torch ended {result.outcome} and disagreed with the "
                     f"model in {len(result.differences)} places. Replays with `meshsim run`."),
    )
    return scenario.save(Path(save_dir) / f"{scenario.name}.toml")
