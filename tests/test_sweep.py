"""What a sweep reaches, counted by what it produced and checked; the layout algebra against torch's own; seeded
DTensor bugs caught; shrinking bounded."""

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings

from meshsim import Cluster, Plan, Topology, step
from meshsim.check import check
from meshsim.core.wire import error_value
from meshsim.model.expect import Err, ModelRaise
from meshsim.ops.layouts import Layout, layout_steps
from meshsim.run.tiers import open_executor
from meshsim.sweep.loop import fuzz
from meshsim.sweep.produced import MESH_KINDS, Produced, cells
from meshsim.sweep.strategies import matrix_plans

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_default_sweep_produces_and_checks_every_derived_mesh_and_every_redistribute_cell():
    # the model tier's record is the model's prediction: what a sweep produces where torch agrees, in seconds
    with open_executor(Topology(2, 4), "model") as executor:
        report = fuzz(executor, 400, seed=0)
    assert report.passed
    assert report.produced.missing() == {"meshes": [], "cells": [], "conditions": []}
    assert len(report.produced.cells) == len(cells()) == 33
    assert set(report.produced.meshes) == set(MESH_KINDS.values())


def _produced(plan, world=8):
    with open_executor(Topology(2, world // 2), "model") as executor:
        result = check(executor, plan)
    produced = Produced()
    produced.add(plan, result.record)
    return produced


def test_a_derived_mesh_counts_only_when_it_was_made_and_then_used():
    made = _produced(Plan((step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m"),
                           step("slice", src="m", names="a", out="used"), step("check", mesh="used"),
                           step("slice", src="m", names="b", out="unused"),
                           step("slice", src="m", names=["b", "a"], out="refused"),
                           step("check", mesh="refused", expect_error=True))))
    assert made.meshes["slice"] == 1  # the refused one never existed, the unused one was never checked


def test_a_transform_counts_by_the_moves_torch_makes_on_dims_that_move_data():
    made = _produced(Plan((step("init_device_mesh", shape=[2, 1, 4], names=["a", "one", "b"], out="m"),
                           step("distribute", mesh="m", shape=[5], placements=["S(0)", "S(0)", "R"], out="t"),
                           step("redistribute", tensor="t", placements=["R", "R", "S(0)"], out="u"))))
    # S(0) -> R on the outer dim (the size-1 dim moves nothing), then R -> S(0) on the inner one
    assert made.cells == {("outer", "S", "R"): 1, ("inner", "R", "S"): 1}
    assert made.conditions["uneven"] == made.conditions["size-1 mesh dim"] == 1
    assert made.conditions["nested shards"] == 1  # dim 0 of the tensor sharded on two mesh dims


@given(layout_steps(8))
@settings(max_examples=300, deadline=None)
def test_the_models_layout_algebra_answers_every_drawn_question_as_torchs_does(st_):
    args = st_.args
    try:
        expected = Layout.model(None, args)
    except ModelRaise as exc:
        expected = exc.err
    try:
        observed = Layout.torch(None, args)
    except Exception as exc:
        observed = error_value(exc)
    assert expected.matches(observed) if isinstance(expected, Err) else expected == observed, args


@pytest.mark.parametrize("fault", ["outer_shard_to_shard_flipped", "partials_reduced_on_one_dim",
                                   "outer_reduce_scatter_rolled"])
def test_a_seeded_dtensor_bug_is_caught_and_shrunk_to_a_redistribute(fault):
    with Cluster(Topology(2, 4), deadline=10, setup=f"faults:{fault}") as cluster:
        report = fuzz(cluster, len(matrix_plans(8)) + 5, seed=1)
    assert not report.passed
    plan = report.failure.plan
    assert len(plan.steps) <= 4 and "redistribute" in [s.op for s in plan.steps], plan.describe()


def test_shrinking_a_hang_stops_at_its_budget_and_says_so(tmp_path):
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "meshsim", "fuzz", "--hosts", "2", "--devices-per-host", "4",
                          "--examples", "40", "--seed", "1", "--deadline", "3", "--shrink-budget", "1",
                          "--setup", "faults:rank_3_stalls_in_all_gather", "--save", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, env=env, cwd=HERE)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "shrinking stopped at its budget of 1 s" in out.stdout
    assert "shrinking:" in out.stderr  # a log, not a live bar, still hears about the shrink
    assert "Traceback" not in out.stdout + out.stderr


def test_a_long_plan_on_the_thread_tier_gets_the_time_its_length_needs_and_other_tiers_keep_their_deadline(
        monkeypatch):
    from meshsim.core import deadlines
    from meshsim.spec.plan import Plan
    from meshsim.sweep import loop

    waits = []

    class Passed:
        passed = True

    def check(cluster, plan, wait, **_):
        waits.append(wait)
        return Passed()

    monkeypatch.setattr(loop, "check", check)
    monkeypatch.setattr(loop, "_count", lambda *_: None)
    plan = Plan(tuple(_steps(37)))
    for tier, world in (("thread", 64), ("process", 8)):
        cluster = type("Stub", (), {"tier": tier, "world": world, "deadline": 12.0, "topology": None})()
        loop._Sweep(cluster, 12.0, False, 3.0, 10.0, None, []).attempt(plan)
    assert waits == [deadlines.THREAD_S_PER_RANK_STEP * 64 * 37, 12.0]
    assert deadlines.for_plan("thread", 64, 1, 12.0) == 12.0  # a short plan keeps the world's default


def _steps(n):
    from meshsim.spec.plan import Step

    return [Step("barrier", {}) for _ in range(n)]
