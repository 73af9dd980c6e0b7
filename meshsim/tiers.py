"""The four tiers that run a plan, and the model tier itself.

    process  forked worker processes on gloo (or NCCL), up to 64 ranks     meshsim.run.process.Cluster
    thread   threads of one process on torch's threaded group, to 1,024   meshsim.run.threads.ThreadExecutor
    fake     each rank alone on torch's fake group, to a million          meshsim.run.fake.FakeExecutor
    model    no ranks: the reference model alone                          ModelExecutor (below)

All four take the same plans and give one verdict through meshsim.check.

The model tier lives here, not in meshsim.run, because it is made of the model (meshsim.run never imports it).

It answers what the model predicts every rank observes, as if torch had done it: where torch is known to
differ from what is right (a Quirk), torch's side is what the record shows, so the verdict reports the same
findings as a real run would; a predicted hang shows as the stuck ranks, in the call the model says they
wait in, so the diagnosis names them as on a real run. It checks nothing about torch; the report says so.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from . import deadlines
from .model.expect import Err, Quirk
from .spec.platform import CPU
from .outcome import UNDEFINED
from .run.record import RankState, RunRecord
from .spec.topology import Topology
from .wire import DIED, STUCK, CallBegun, RunPlan

TIERS = ("process", "thread", "fake", "model")


class TierError(ValueError):
    """An unknown tier, or options a tier does not take."""


def open_executor(topology: Topology, tier: str = "process", deadline: float = deadlines.PLAN_S,
                  ranks: int | None = None, **options: Any) -> Any:
    """An executor of `tier` for `topology` (not started: use it in a `with` block).

    `ranks` samples that many ranks on the fake tier (every host's first and last rank, then a seeded spread);
    `options` go to the process tier's Cluster (backend, setup, start_timeout, ...).
    """
    if tier not in TIERS:
        raise TierError(f"unknown tier {tier!r}; choose one of {', '.join(TIERS)}")
    if ranks is not None and tier != "fake":
        raise TierError("--ranks samples ranks on the fake tier only (the other tiers run every rank together)")
    start_timeout = options.pop("start_timeout", deadlines.START_S)
    if tier == "process":
        from .run.process import Cluster

        return Cluster(topology, deadline=deadline, start_timeout=start_timeout, **options)
    unsupported = sorted(k for k, v in options.items() if v not in (None, "gloo", False))
    if unsupported:
        raise TierError(f"the {tier} tier does not take {', '.join(unsupported)} (the process tier does)")
    if tier == "thread":
        from .run.threads import ThreadExecutor

        return ThreadExecutor(topology, deadline=deadline, start_timeout=start_timeout)
    if tier == "fake":
        from .run.fake import FakeExecutor

        return FakeExecutor(topology, deadline=deadline, start_timeout=start_timeout, ranks=ranks)
    return ModelExecutor(topology, deadline=deadline)


class ModelExecutor:
    tier = "model"
    max_world = 1 << 20
    platform = CPU  # no ranks: the model answers for a CPU cluster

    def __init__(self, topology: Topology, deadline: float = deadlines.PLAN_S, **_: Any):
        self.topology = topology
        self.deadline = deadlines.checked(deadline)

    @property
    def world(self) -> int:
        return self.topology.world

    def __enter__(self) -> "ModelExecutor":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def start(self) -> "ModelExecutor":
        return self

    def close(self) -> None:
        pass

    def run(self, plan: Any, deadline: float | None = None, strict: bool = False) -> Any:
        from .check import check

        return check(self, plan, self.deadline if deadline is None else deadline, strict=strict)

    def execute(self, work: Any, meanwhile: Callable[[], Any] | None = None) -> RunRecord:
        """`meanwhile` (meshsim.check) returns the model's prediction: the record is made of it."""
        if not isinstance(work, RunPlan):
            raise TypeError("the model tier runs plans only")
        started = time.monotonic()
        prediction = meanwhile() if meanwhile is not None else None
        if prediction is None:
            from .check import prediction_for

            prediction = prediction_for(work.plan, self.world, work.deadline, self.platform)
        states = _states(prediction)
        record = RunRecord(self.world, work.deadline, states, time.monotonic() - started,
                           bool(prediction.stuck), tier=self.tier)
        record.notes.append("model tier: these are the model's own predictions; torch did not run")
        return record


def _states(prediction: Any) -> list[RankState]:
    seen: dict[int, Any] = {}
    states = []
    for pred in prediction.ranks:
        state = RankState(pred.rank, observations=[_as_observed(o, seen) for o in pred.observations],
                          end=pred.end, end_step=pred.end_step, done=True)
        if pred.end == DIED:
            state.exitcode = 1
        states.append(state)
    for stuck in prediction.stuck:
        state = states[stuck.rank]
        state.end, state.done, state.step = STUCK, False, stuck.call.step
        state.call = CallBegun(stuck.call.kind if stuck.call.kind != "create" else "new_group",
                               tuple(stuck.call.members), str(stuck.call.key[0]), 0, None)
    return states


def _as_observed(value: Any, seen: dict[int, Any]) -> Any:
    """A predicted value as torch would have reported it. Values without a Quirk or an Err come back as the same
    object (the verdict then compares by identity: a 100,000-rank view is not walked once per rank)."""
    if isinstance(value, Quirk):
        return _as_observed(value.right if value.torch == UNDEFINED else value.torch, seen)
    if isinstance(value, Err):
        return {"error": [value.type or "Exception", value.match]}
    if not isinstance(value, (list, dict)):
        return value
    hit = seen.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    if isinstance(value, list):
        parts = [_as_observed(v, seen) for v in value] if value and isinstance(value[0], (list, dict, Quirk, Err)) \
            else value
        out: Any = value if parts is value or all(a is b for a, b in zip(parts, value)) else parts
    else:
        items = {k: _as_observed(v, seen) for k, v in value.items()}
        out = value if all(items[k] is v for k, v in value.items()) else items
    seen[id(value)] = (value, out)
    return out
