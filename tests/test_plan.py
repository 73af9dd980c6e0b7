"""The plan language: pure data that round-trips, and validation that names the bad step."""

import pytest
from hypothesis import given, settings

from meshsim.ops import validate
from meshsim.spec.plan import Plan, PlanError, step
from meshsim.sweep.strategies import plans


@settings(max_examples=60)
@given(plans(8))
def test_generated_plans_survive_a_toml_round_trip(plan):
    assert Plan.from_toml(plan.to_toml()) == plan


@settings(max_examples=60)
@given(plans(8))
def test_generated_plans_survive_a_json_round_trip_and_validate(plan):
    assert Plan.from_json(plan.to_json()) == plan
    validate(plan, 8)


def test_divergence_fields_round_trip_through_toml():
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["dp", "tp"], out="m",
                      on_rank={5: {"shape": [4, 2]}}),
                 step("all_reduce", mesh="m", dim="tp", skip_on=[5]),
                 step("sleep", seconds=0.5, only_on=[1, 2])))
    again = Plan.from_toml(plan.to_toml())
    assert again == plan
    assert again.steps[0].args_for(5)["shape"] == [4, 2]
    assert not again.steps[1].runs_on(5) and again.steps[2].runs_on(1)


def test_repr_of_a_plan_rebuilds_it():
    from meshsim.spec.plan import step as step_  # noqa: F401 -- eval below needs `step` in scope
    plan = Plan((step("init_device_mesh", shape=[2, 4], out="m"), step("check", mesh="m", skip_on=[3])))
    assert eval(repr(plan), {"Plan": Plan, "step": step}) == plan


@pytest.mark.parametrize("bad, message", [
    (step("frobnicate", out="m"), "unknown op 'frobnicate'"),
    (step("slice", src="nope", names="tp", out="s"), "unknown handle 'nope'"),
    (step("init_device_mesh", shape=[3, 3], out="m"), "needs 9 ranks but the world has 8"),
    (step("init_device_mesh", shape=[2, 4], out="m", skip_on=[8]), "rank 8 is not in the world"),
    (step("init_device_mesh", names=["a"], out="m"), "missing field 'shape'"),
    (step("init_device_mesh", shape=[8], colour="red", out="m"), "unknown field 'colour'"),
    (step("mesh", layout=[[0, 1], [2]], out="m"), "rectangular"),
    (step("mesh", layout=[[0, 9]], out="m"), "rank 9"),
    (step("init_device_mesh", shape=[8]), "needs 'out'"),
    (step("sleep", seconds=-1), "seconds from 0"),
])
def test_validation_names_the_step_and_the_problem(bad, message):
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["dp", "tp"], out="m0"), bad))
    with pytest.raises(PlanError, match="step 1") as info:
        validate(plan, 8)
    assert message in str(info.value)


def test_a_step_meant_to_fail_may_ask_for_more_ranks_than_the_world():
    validate(Plan((step("init_device_mesh", shape=[3, 3], out="m", expect_error=True),)), 8)


def test_an_all_submeshes_result_is_named_by_index():
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["dp", "tp"], out="m"),
                 step("all_submeshes", src="m", dim="tp", out="s"),
                 step("check", mesh="s")))
    with pytest.raises(PlanError, match="s.0"):
        validate(plan, 8)
