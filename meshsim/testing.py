"""Assertions for tests: a plan agrees with the model, a property holds for generated plans."""

from __future__ import annotations

import io
from typing import Any, Callable

from rich.console import Console

from .report import render_result


def render_text(result: Any, title: str = "", width: int = 160) -> str:
    buffer = io.StringIO()
    render_result(result, Console(file=buffer, width=width, color_system=None, force_terminal=False), title=title)
    return buffer.getvalue()


class Disagreement(AssertionError):
    """torch did not do what the model says (the message is the full report)."""

    def __init__(self, result: Any):
        super().__init__("\n" + render_text(result))
        self.result = result


def assert_agrees(cluster: Any, plan: Any, deadline: float | None = None, strict: bool = False) -> Any:
    """Run `plan` on every rank; raise Disagreement with the report unless torch agrees with the model."""
    result = cluster.run(plan, deadline=deadline)
    result.strict = strict
    if not result.passed:
        raise Disagreement(result)
    return result


def check_property(cluster: Any, strategy: Any = None, max_examples: int = 50, deadline: float | None = None,
                   strict: bool = False, **settings_kwargs: Any) -> None:
    """For plans drawn from `strategy` (default: meshsim.strategies.plans), torch agrees with the model.

    Failures shrink to a minimal plan, which the raised error shows in full.
    """
    from hypothesis import HealthCheck, given, settings

    from .check import platform_of
    from .strategies import plans

    strategy = strategy if strategy is not None else plans(cluster.world, device=platform_of(cluster).device)

    @settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow],
              **settings_kwargs)
    @given(strategy)
    def torch_agrees_with_model(plan: Any) -> None:
        assert_agrees(cluster, plan, deadline=deadline, strict=strict)

    torch_agrees_with_model()


def check_property_over_topologies(get_cluster: Callable[[Any], Any], topologies: list | None = None,
                                   max_examples: int = 50, deadline: float | None = None, strict: bool = False,
                                   **settings_kwargs: Any) -> None:
    """Like check_property, with the topology drawn too (get_cluster(topology) -> a running cluster).

    Failures shrink toward the smallest topology as well as the shortest plan.
    """
    from hypothesis import HealthCheck, given, settings

    from .strategies import topology_plans

    @settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow],
              **settings_kwargs)
    @given(topology_plans(topologies))
    def torch_agrees_with_model_on_every_topology(case: Any) -> None:
        topology, plan = case
        assert_agrees(get_cluster(topology), plan, deadline=deadline, strict=strict)

    torch_agrees_with_model_on_every_topology()


def run_on_every_rank(cluster: Any, fn: Callable, *args: Any, deadline: float | None = None, **kwargs: Any) -> list:
    """fn(*args, **kwargs) on every rank; its per-rank return values, or AssertionError with a diagnosis."""
    return cluster.run_fn(fn, *args, deadline=deadline, **kwargs).values
