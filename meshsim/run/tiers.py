"""The four tiers that run a plan (meshsim.spec.tiers says what each can do), and the model tier itself.

    process  forked worker processes on gloo (or NCCL), up to 64 ranks     meshsim.run.process.ProcessExecutor
    thread   threads of one process on torch's threaded group, to 1,024   meshsim.run.threads.ThreadExecutor
    fake     each rank alone on torch's fake group, to a million          meshsim.run.fake.FakeExecutor
    model    no ranks: the reference model alone                          ModelExecutor (below)

All four take the same plans and give one verdict through meshsim.check.

The model tier is made of the model's prediction, which meshsim.check hands it as `meanwhile` (meshsim.run never
imports the model). It answers what the model predicts every rank observes, as if torch had done it: where torch is
known to differ from what is right (a Quirk), torch's side is what the record shows, so the verdict reports the same
findings as a real run would; a predicted hang shows as the stuck ranks, in the call the model says they wait in, so the
diagnosis names them as on a real run. It checks nothing about torch; the report says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core import deadlines
from ..core.record import RunRecord
from ..core.wire import RunPlan
from ..spec.platform import CPU
from ..spec.tiers import TIERS, TierError, capabilities
from ..spec.topology import Topology

__all__ = ["TIERS", "TierError", "open_executor", "ModelExecutor"]


def open_executor(topology: Topology, tier: str = "process", deadline: float | None = None,
                  ranks: int | None = None, **options: Any) -> Any:
    """An executor of `tier` for `topology` (not started: use it in a `with` block).

    `deadline` bounds each run (None: the tier's default for the world, meshsim.core.deadlines.plan); `ranks` samples
    that many ranks on the fake tier (every host's first and last rank, then a seeded spread); `options` go to the
    process tier (backend, setup, start_timeout, ...). What a tier does not take is refused here, in one line,
    before anything starts.
    """
    caps = capabilities(tier)
    watch = options.pop("watch", None)
    executor = _executor(topology, tier, caps, deadline, ranks, options)
    executor.watch = watch  # told how far each run is (meshsim.core.record.RunStatus): a progress bar
    return executor


def _executor(topology: Topology, tier: str, caps: Any, deadline: float | None, ranks: int | None,
              options: dict[str, Any]) -> Any:
    if ranks is not None and tier != "fake":
        raise TierError("--ranks samples ranks on the fake tier only (the other tiers run every rank together)")
    if topology.world > caps.max_world:
        raise TierError(f"{topology} is {topology.world:,} ranks; the {tier} tier runs at most {caps.max_world:,}")
    start_timeout = options.pop("start_timeout", None)
    backend = options.get("backend")
    if backend not in (None, *caps.backends):
        raise TierError(f"the {tier} tier does not take backend {backend!r} (it runs {', '.join(caps.backends)})")
    if options.get("setup") is not None and not caps.setup:
        raise TierError(f"the {tier} tier does not take a setup function (the process tier does)")
    if tier == "process":
        from .process import ProcessExecutor

        return ProcessExecutor(topology, deadline=deadline, start_timeout=start_timeout, **options)
    unsupported = sorted(k for k, v in options.items() if v not in (None, False) and k not in ("backend", "setup"))
    if unsupported:
        raise TierError(f"the {tier} tier does not take {', '.join(unsupported)} (the process tier does)")
    if tier == "thread":
        from .threads import ThreadExecutor

        return ThreadExecutor(topology, deadline=deadline, start_timeout=start_timeout)
    if tier == "fake":
        from .fake import FakeExecutor

        return FakeExecutor(topology, deadline=deadline, start_timeout=start_timeout, ranks=ranks)
    return ModelExecutor(topology, deadline=deadline)


class ModelExecutor:
    """The reference model answers for every rank (see the module's docstring)."""

    tier = "model"
    capabilities = TIERS["model"]
    watch: Callable[[Any], None] | None = None  # (the model tier has no ranks to follow)
    platform = CPU  # no ranks: the model answers for a CPU cluster
    by_class = True  # ranks that run a plan alike are answered once (meshsim.model.classes): a million ranks in seconds

    def __init__(self, topology: Topology, deadline: float | None = None):
        self.topology = topology
        self.deadline = deadlines.for_tier(self.tier, topology.world, deadline)[0]

    @property
    def world(self) -> int:
        return self.topology.world

    def __enter__(self) -> ModelExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def start(self) -> ModelExecutor:
        return self

    def close(self) -> None:
        pass

    def execute(self, work: Any, meanwhile: Callable[[], Any] | None = None,
                if_hangs: Callable[[], float | None] | None = None) -> RunRecord:
        """`meanwhile` (meshsim.check) returns the model's prediction: the record is made of it."""
        if not isinstance(work, RunPlan):
            raise TierError("the model tier runs plans only")
        if meanwhile is None:
            raise TierError("the model tier answers with the model's prediction: run it through meshsim.check")
        started = time.monotonic()
        prediction = meanwhile()
        record = prediction.as_record(work.deadline, self.tier, work.plan)
        record.elapsed = time.monotonic() - started
        record.notes.append("model tier: these are the model's own predictions; torch did not run")
        record.notes.extend(prediction.notes)
        return record
