"""Executors: they run a plan, a user function or a script on ranks under a deadline and return a RunRecord
(meshsim.core.record). They neither predict nor judge: meshsim.check does validate -> predict -> execute -> judge.

    ProcessExecutor    worker processes forked on this machine, gloo or NCCL   meshsim.run.process
    ThreadExecutor     threads of one host process, torch's threaded group     meshsim.run.threads
    FakeExecutor       each rank alone on torch's fake group                    meshsim.run.fake
    TorchrunExecutor   the processes torchrun started, on one node or many     meshsim.run.torchrun

They are siblings: the three local ones share a worker pool (meshsim.run.pool) and one follow loop
(meshsim.run.follow), and declare what they can run and check (meshsim.spec.tiers.Capabilities), which is
refused before a run starts. The ranks boot and tear down with meshsim.run.rank.RankSession and interpret plans
with meshsim.run.interpreter. This package (with the torchrun entry) is the only code in meshsim that calls
torch.distributed, and it imports nothing of the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..core.record import RankState, RunRecord
from ..core.wire import RunFunction, RunPlan, RunScript
from ..spec.platform import Platform
from ..spec.tiers import Capabilities, TierError
from ..spec.topology import Topology

Work = RunPlan | RunFunction | RunScript

if TYPE_CHECKING:
    from typing import Self


class Executor(Protocol):
    """What every tier implements; meshsim.check and meshsim.launch.launcher call nothing else."""

    tier: str
    capabilities: Capabilities
    topology: Topology
    platform: Platform

    @property
    def world(self) -> int: ...

    def start(self) -> Self: ...

    def close(self) -> None: ...

    def execute(self, work: Work, meanwhile: Callable[[], Any] | None = None,
                if_hangs: Callable[[], float | None] | None = None) -> RunRecord:
        """Run `work` on every rank within work.deadline; `meanwhile` runs here while the ranks work. Where
        `if_hangs()` (asked after `meanwhile`) expects a hang, it says how long the run gets instead, and a tier
        that can tell may call the unfinished ranks stuck as soon as none of them moves (meshsim.run.still)."""
        ...


def refuse_unless_capable(executor: Executor, work: Work) -> None:
    """One line, before anything runs, where the executor cannot run this kind of work."""
    caps = executor.capabilities
    if isinstance(work, RunFunction) and not caps.functions:
        raise TierError(f"the {executor.tier} tier runs plans only: a user function needs the process or thread tier")
    if isinstance(work, RunScript) and not caps.scripts:
        raise TierError(f"the {executor.tier} tier cannot run a script: `meshsim launch` uses the process tier")


def __getattr__(name: str) -> Any:
    # The executors import torch; keep `import meshsim.run` light for the pure parts.
    if name in ("ProcessExecutor", "resolve_backend"):
        from . import process

        return getattr(process, name)
    if name in ("ClusterError", "SetupError"):
        from ..core import errors

        return getattr(errors, name)
    raise AttributeError(name)


__all__ = ["Executor", "Work", "RankState", "RunRecord", "ProcessExecutor", "ClusterError", "SetupError",
           "refuse_unless_capable", "resolve_backend"]
