"""The one place that checks a plan: validate -> predict -> execute -> judge.

Every entry point goes through `check`: the Python API (Cluster.run), fuzz, scenarios, nightly, the pytest
plugin and torchrun mode. It takes any executor (meshsim.run.Executor), and strictness is a parameter.
"""

from __future__ import annotations

from typing import Any

from . import deadlines
from .judge.verdict import Result, judge
from .spec.platform import CPU, Platform
from .predict import Prediction, no_gc, predict, unpredictable
from .ops import validate
from .spec.plan import Plan, PlanError
from .wire import RunPlan


def prediction_for(plan: Plan, world: int, deadline: float, platform: Platform = CPU) -> Prediction:
    """The model's prediction, or, when the model itself fails, a prediction that says it cannot tell."""
    try:
        return predict(plan, world, deadline, platform=platform)
    except Exception as exc:  # the model's own bug becomes a verdict, never a traceback
        return unpredictable(plan, world, exc)


def platform_of(executor: Any) -> Platform:
    """The machine the executor's ranks run on, as the model needs it (an executor that does not say: a CPU one)."""
    return getattr(executor, "platform", CPU)


def check(executor: Any, plan: Plan, deadline: float | None = None, strict: bool = False,
          prediction: Prediction | None = None) -> Result:
    """Run `plan` on the executor's ranks and judge what they observed against the model."""
    if not isinstance(plan, Plan):
        raise PlanError(f"expected a meshsim Plan, got {type(plan).__name__}")
    validate(plan, executor.world)
    deadline = deadlines.checked(deadlines.PLAN_S if deadline is None else deadline)
    found: list[Prediction] = [prediction] if prediction is not None else []

    def meanwhile() -> Prediction:  # the model predicts while the ranks work; the model tier uses its answer
        if not found:
            found.append(prediction_for(plan, executor.world, deadline, platform_of(executor)))
        return found[0]

    with no_gc():  # a large world's observations live until judged: collecting on the way is wasted work
        record = executor.execute(RunPlan(plan, deadline), meanwhile=meanwhile)
        return judge(plan, meanwhile(), record, strict=strict)
