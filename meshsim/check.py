"""The one path every run takes: validate -> (predict) -> execute -> judge.

`check` runs a plan (the Python API's Cluster.run, fuzz, scenarios, nightly, the pytest plugin, torchrun mode,
replay), `run_function` a user's function (run_fn, a cluster's setup, the recipe's examples), and
meshsim.launch.launcher a script. Each hands its work to an executor (meshsim.run.Executor), which returns a record, and
the record to the one judge (meshsim.judge.verdict.judge), which returns a Verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from .core import deadlines
from .core.outcome import HANG, UNDEFINED
from .core.record import RunRecord
from .core.releases import text
from .core.wire import RunFunction, RunPlan
from .judge.verdict import Verdict, judge
from .model import torch_side
from .model.choices import changes, torch_chose
from .model.predict import Chosen, Prediction, no_gc, predict, unpredictable
from .ops import validate
from .spec.plan import Plan, PlanError
from .spec.platform import CPU, Platform


def prediction_for(plan: Plan, world: int, deadline: float, platform: Platform = CPU,
                   by_class: bool = False, chosen: Chosen | None = None) -> Prediction:
    """The model's prediction, or, when the model itself fails, a prediction that says it cannot tell.
    `by_class`: rank classes answered once each (the model tier: meshsim.model.classes)."""
    try:
        return predict(plan, world, deadline, platform=platform, by_class=by_class, chosen=chosen)
    except Exception as exc:  # the model's own bug becomes a verdict, never a traceback
        return unpredictable(plan, world, exc, by_class)


def check(executor: Any, plan: Plan, deadline: float | None = None, strict: bool = False,
          prediction: Prediction | None = None, hang_deadline: float | None = None,
          hangs: bool | None = None) -> Verdict:
    """Run `plan` on the executor's ranks and judge what they observed against the model.

    The model predicts while the ranks work. Where it says torch hangs here (or may: undefined), the run gets
    `hang_deadline` (if shorter than `deadline`), and ranks that have all gone still are stuck before that
    (meshsim.run.still): waiting on would only confirm it. `hangs` overrides the model (a sweep shrinking a hang
    treats every candidate so)."""
    if not isinstance(plan, Plan):
        raise PlanError(f"expected a meshsim Plan, got {type(plan).__name__}")
    validate(plan, executor.world, executor.platform)
    deadline = deadlines.checked(_default_deadline(executor) if deadline is None else deadline)
    found: list[Prediction] = [prediction] if prediction is not None else []

    def meanwhile() -> Prediction:  # the model predicts while the ranks work; the model tier uses its answer
        if not found:
            found.append(prediction_for(plan, executor.world, deadline, executor.platform,
                                        getattr(executor, "by_class", False)))
        return found[0]

    def if_hangs() -> float | None:
        expected = hangs if hangs is not None else torch_side(meanwhile().outcome) in (HANG, UNDEFINED)
        return min(deadline, hang_deadline) if expected and hang_deadline is not None else deadline if expected \
            else None

    with no_gc():  # a large world's observations live until judged: collecting on the way is wasted work
        record = executor.execute(RunPlan(plan, deadline), meanwhile=meanwhile, if_hangs=if_hangs)
        return judge(record, "plan", plan, _as_torch_chose(plan, meanwhile(), record, executor, deadline),
                     strict=strict, topology=executor.topology)


def _as_torch_chose(plan: Plan, prediction: Prediction, record: RunRecord, executor: Any, deadline: float
                    ) -> Prediction:
    """The prediction, made again with torch's own choices where they differ from the model's (a sharding
    strategy's placements: meshsim.model.choices); the record says where torch changed its choice."""
    if prediction.model_error is not None:
        return prediction
    chosen = torch_chose(plan, prediction, record)
    if not chosen:
        return prediction
    record.notes.extend(changes(plan, prediction, record, chosen, text(executor.platform.release)))
    return prediction_for(plan, executor.world, deadline, executor.platform, getattr(executor, "by_class", False),
                          chosen)


def _default_deadline(executor: Any) -> float:
    """The executor's own deadline (its tier's default for its world, unless it was given one)."""
    found = getattr(executor, "deadline", None)
    return float(found) if found is not None else deadlines.plan(executor.tier, executor.world)


_PASSED: WeakKeyDictionary[Any, dict[Any, Verdict]] = WeakKeyDictionary()


def passed_here(executor: Any) -> dict[Any, Verdict]:
    """Verdicts of plans that passed on this executor since it last ran a user's function, by whatever key the
    caller gives (a sweep: the plan, strict, deadline): what a plan leaves on the ranks is destroyed after it, but a
    function may change torch on them (a seeded bug), so its run forgets them."""
    return _PASSED.setdefault(_executor_of(executor), {})


def _executor_of(cluster: Any) -> Any:
    return getattr(cluster, "executor", cluster)  # a Cluster: its executor, which the pytest plugin shares


def run_function(executor: Any, fn: Callable, args: tuple = (), kwargs: dict | None = None,
                 deadline: float | None = None) -> Verdict:
    """fn(*args, **kwargs) on every rank of the executor, under a deadline (default deadlines.FUNCTION_S).

    The function travels pickled by the `multiprocess` package's dill-based pickler, so closures and lambdas
    defined inside a test work."""
    from multiprocess.reduction import ForkingPickler

    deadline = deadlines.checked(deadlines.FUNCTION_S if deadline is None else deadline)
    payload = bytes(ForkingPickler.dumps((fn, args, kwargs or {})))
    _PASSED.pop(_executor_of(executor), None)
    record = executor.execute(RunFunction(payload, deadline))
    return judge(record, "function", topology=getattr(executor, "topology", None))
