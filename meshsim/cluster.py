"""A simulated cluster, as a user holds it: an executor of some tier, and the one path to run work on it.

    with Cluster(Topology(hosts=2, devices_per_host=4)) as cluster:
        verdict = cluster.run(plan)             # meshsim.check.check
        run = cluster.run_fn(fn, *args)         # meshsim.check.run_function

Executors (meshsim.run, meshsim.run.tiers) only execute; this is where the Python API meets the judge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .check import check, run_function
from .judge.verdict import Verdict
from .spec.topology import Topology


class Cluster:
    """H simulated hosts x D devices on a tier (process by default), started once, reused for many runs.

    Options go to the tier's executor (meshsim.run.tiers.open_executor): backend, setup, start_timeout, ranks (fake).
    Anything else asked of a Cluster is its executor's (world, topology, tier, backend, pids, ...).
    """

    def __init__(self, topology: Topology, backend: str = "gloo", deadline: float | None = None,
                 tier: str = "process", **options: Any):
        from .run.tiers import open_executor

        if tier == "process":
            options["backend"] = backend
        elif backend != "gloo":
            options["backend"] = backend
        self.executor = open_executor(topology, tier, deadline=deadline, **options)
        self.deadline = self.executor.deadline  # as given, else the tier's default for the world

    def __getattr__(self, name: str) -> Any:
        if name == "executor":  # not set: __init__ failed
            raise AttributeError(name)
        return getattr(self.executor, name)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> Cluster:
        self.executor.start()
        return self

    def close(self) -> None:
        self.executor.close()

    def run(self, plan: Any, deadline: float | None = None, strict: bool = False) -> Verdict:
        """Run a plan on every rank and judge it against the model. Returns a Verdict."""
        return check(self.executor, plan, self.deadline if deadline is None else deadline, strict=strict)

    def run_fn(self, fn: Callable, *args: Any, deadline: float | None = None, **kwargs: Any) -> Verdict:
        """fn(*args, **kwargs) on every rank (closures and lambdas too), under a deadline; a Verdict whose .values
        are the ranks' return values."""
        return run_function(self.executor, fn, args, kwargs, deadline)

    def __repr__(self) -> str:
        return f"Cluster({self.executor.topology}, tier={self.executor.tier!r})"
