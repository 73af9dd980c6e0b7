"""Assertions for tests: a plan agrees with the model, a property holds for generated plans."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..judge.report import verdict_text
from ..judge.verdict import Failed, Verdict

Disagreement = Failed  # torch did not do what the model says (the message is the full report)


def render_text(verdict: Verdict, title: str = "", width: int = 160) -> str:
    return verdict_text(verdict, width=width)


def assert_agrees(cluster: Any, plan: Any, deadline: float | None = None, strict: bool = False) -> Verdict:
    """Run `plan` on every rank; raise Failed with the report unless torch agrees with the model."""
    result = cluster.run(plan, deadline=deadline, strict=strict)
    return result.raise_for_outcome()


def check_property(cluster: Any, strategy: Any = None, max_examples: int = 50, deadline: float | None = None,
                   strict: bool = False, **settings_kwargs: Any) -> None:
    """For plans drawn from `strategy` (default: meshsim.sweep.strategies.plans), torch agrees with the model.

    Failures shrink to a minimal plan, which the raised error shows in full.
    """
    from hypothesis import HealthCheck, given, settings

    from .strategies import plans

    strategy = strategy if strategy is not None else plans(cluster.world, device=cluster.platform.device)

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
