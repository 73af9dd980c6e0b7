"""Run a user's own function on every rank of a cluster, under the same deadline and diagnosis as plans.

The function travels pickled by the `multiprocess` package's dill-based pickler (so closures and lambdas
defined inside a test work) and runs with the
default process group initialised and torchrun's environment set. Every torch.distributed collective and
group creation it makes is reported live, so a hang in user code is diagnosed like a hang in a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import dill
from multiprocess.reduction import ForkingPickler

from . import deadlines
from .outcome import CRASH, ERROR, HANG, PASS, outcome_of
from .wire import FINISHED, STUCK, RunFunction


@dataclass
class RankResult:
    rank: int
    ok: bool
    value: Any = None  # the return value, when ok
    error: BaseException | str | None = None  # the exception (or its repr if it did not pickle)
    traceback: str = ""


@dataclass
class FunctionRun:
    """What fn did on every rank: outcome pass | error | hang | crash, and per-rank results."""

    outcome: str
    results: list[RankResult]
    record: Any
    diagnosis: Any = None
    elapsed: float = 0.0
    failed_ranks: list[int] = field(default_factory=list)

    @property
    def values(self) -> list[Any]:
        """Each rank's return value; raises if the run did not pass."""
        if self.outcome != PASS:
            raise FunctionFailed(self)
        return [r.value for r in self.results]

    def summary(self) -> str:
        if self.outcome == PASS:
            return f"pass on {len(self.results)} ranks in {self.elapsed:.2f} s"
        lines = [f"{self.outcome} after {self.elapsed:.2f} s"]
        for r in self.results:
            if not r.ok and r.error is not None:
                lines.append(f"  rank {r.rank}: {r.error!r}")
        if self.diagnosis is not None:
            lines.append("  " + self.diagnosis.summary)
        return "\n".join(lines)


class FunctionFailed(AssertionError):
    def __init__(self, run: FunctionRun):
        super().__init__(run.summary())
        self.run = run


def run_function(executor: Any, fn: Callable, args: tuple, kwargs: dict, deadline: float | None) -> FunctionRun:
    """fn(*args, **kwargs) on every rank of the executor, under a deadline (default: the executor's)."""
    from .judge.diagnose import diagnose

    deadline = deadlines.checked(executor.deadline if deadline is None else deadline)
    payload = bytes(ForkingPickler.dumps((fn, args, kwargs)))
    record = executor.execute(RunFunction(payload, deadline))
    results = [_rank_result(state) for state in record.states]
    outcome = outcome_of((s.end for s in record.states), record.timed_out)
    run = FunctionRun(outcome, results, record, elapsed=record.elapsed,
                      failed_ranks=[r.rank for r in results if not r.ok])
    if outcome in (HANG, CRASH) or (outcome == ERROR and record.timed_out):
        run.diagnosis = diagnose(record)
    return run


def _rank_result(state: Any) -> RankResult:
    if state.value is None:
        where = state.where if state.end != STUCK else f"stuck: {state.where}"
        return RankResult(state.rank, False, error=where)
    ok, blob = state.end == FINISHED, state.value
    try:
        value = dill.loads(blob)
    except Exception as exc:  # a result that cannot be rebuilt here is still worth showing
        value = f"<unpicklable: {exc}>"
    if ok:
        return RankResult(state.rank, True, value)
    if isinstance(value, tuple) and len(value) == 2:
        return RankResult(state.rank, False, error=value[0], traceback=value[1])
    return RankResult(state.rank, False, error=str(value))
