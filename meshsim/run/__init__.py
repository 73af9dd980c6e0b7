"""Executors: they run a plan or a user function on ranks under a deadline and return a RunRecord.

They neither predict nor judge (meshsim.check does validate -> predict -> execute -> judge for every entry point).

    Cluster            worker processes forked on this machine, gloo or NCCL (meshsim.run.process)
    TorchrunExecutor   the processes torchrun started, on one node or many (meshsim.run.torchrun)

Both boot and tear down their ranks with meshsim.run.rank.RankSession, and interpret plans with
meshsim.run.interpreter. This package is the only code in meshsim that calls torch.distributed.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Union

from ..wire import RunFunction, RunPlan
from .record import RankState, RunRecord

Work = Union[RunPlan, RunFunction]


class Executor(Protocol):
    world: int

    def execute(self, work: Work, meanwhile: Callable[[], Any] | None = None) -> RunRecord:
        """Run `work` on every rank within work.deadline; `meanwhile` runs here while the ranks work."""
        ...


def __getattr__(name: str) -> Any:
    # The executors import torch; keep `import meshsim.run` light for the pure parts that need RunRecord.
    if name in ("Cluster", "ClusterError", "BACKENDS", "resolve_backend"):
        from . import process

        return getattr(process, name)
    raise AttributeError(name)


__all__ = ["Executor", "Work", "RankState", "RunRecord", "Cluster", "ClusterError", "BACKENDS", "resolve_backend"]
