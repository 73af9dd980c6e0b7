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
    def passed(self) -> bool:
        return self.outcome == PASS

    @property
    def values(self) -> list[Any]:
        """Each rank's return value; raises FunctionFailed (with the whole report) if the run did not pass."""
        self.raise_for_outcome()
        return [r.value for r in self.results]

    def raise_for_outcome(self) -> "FunctionRun":
        """Raise FunctionFailed, whose message is the whole report, unless every rank passed."""
        if self.outcome != PASS:
            raise FunctionFailed(self)
        return self

    @property
    def output(self) -> str:
        """What every rank printed, each line prefixed with its rank as torchrun does ("[rank3]: ...")."""
        return rank_output(self.record.states)

    def summary(self) -> str:
        if self.outcome == PASS:
            return f"pass on {len(self.results)} ranks in {self.elapsed:.2f} s"
        lines = [f"{self.outcome} after {self.elapsed:.2f} s"]
        for ranks, error in _grouped_errors(self.results):
            lines.append(f"  ranks {ranks}: {error}")
        if self.diagnosis is not None:
            lines.append("  " + self.diagnosis.summary)
        return "\n".join(lines)

    def report(self) -> str:
        """The whole story of a failed run: errors with their tracebacks, the diagnosis, every rank's output."""
        from .report import ranks_text

        lines = [self.summary()]
        tracebacks: dict[str, list[int]] = {}
        for r in self.results:
            if r.traceback:
                tracebacks.setdefault(r.traceback, []).append(r.rank)
        for text, ranks in tracebacks.items():
            lines.append(f"  traceback of ranks {ranks_text(ranks)}:\n    " + text.strip().replace("\n", "\n    "))
        if self.diagnosis is not None:
            lines.append(_diagnosis_text(self.diagnosis))
        if self.output.strip():
            lines.append("  rank output:\n" + self.output)
        return "\n".join(lines)


def rank_output(states: list) -> str:
    return "".join(f"[rank{s.rank}]: {line}\n" for s in states for line in s.output.splitlines())


def _diagnosis_text(diagnosis: Any) -> str:
    import io

    from rich.console import Console

    from .report import render_diagnosis

    buffer = io.StringIO()
    render_diagnosis(diagnosis, Console(file=buffer, width=160, color_system=None, force_terminal=False))
    return buffer.getvalue().rstrip()


def _grouped_errors(results: list[RankResult]) -> list[tuple[str, str]]:
    from .report import ranks_text

    groups: dict[str, list[int]] = {}
    for r in results:
        if not r.ok and r.error is not None:
            groups.setdefault(_explain(r.error), []).append(r.rank)
    return [(ranks_text(ranks), text) for text, ranks in groups.items()]


def _explain(error: Any) -> str:
    """An error in words, with what to do about the classic trap of functions pickled by value."""
    text = repr(error)
    if isinstance(error, NameError):
        import re

        found = re.search(r"name '([^']+)' is not defined", str(error))  # .name does not survive pickling
        name = found.group(1) if found else str(error)
        text += (f" -- the name {name!r} does not exist on the ranks. run_fn sends your function by value, so the "
                 "globals it uses must exist in the ranks' processes too; a name imported or defined under "
                 "`if __name__ == \"__main__\":` exists only in your own process. Import it inside the function, "
                 "or at the top of its module.")
    return text


class FunctionFailed(AssertionError):
    """A user function that did not pass on every rank; the message is the whole report."""

    def __init__(self, run: FunctionRun):
        super().__init__("\n" + run.report())
        self.run = run


def run_function(executor: Any, fn: Callable, args: tuple, kwargs: dict, deadline: float | None) -> FunctionRun:
    """fn(*args, **kwargs) on every rank of the executor, under a deadline (default deadlines.FUNCTION_S)."""
    from .judge.diagnose import diagnose

    deadline = deadlines.checked(deadlines.FUNCTION_S if deadline is None else deadline)
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
