"""The Hypothesis strategies draw what they promise, and plans the model can follow."""

import math

from hypothesis import given
from hypothesis import strategies as st

from meshsim.model.predict import predict
from meshsim.ops import validate
from meshsim.sweep.strategies import (
    dim_names,
    divergent_plans,
    mesh_shapes,
    plans,
    rank_layouts,
    topologies,
)


@given(topologies(max_world=32))
def test_topologies_stay_within_the_world_limit(topology):
    assert 1 <= topology.world <= 32


@given(st.integers(1, 32).flatmap(lambda w: st.tuples(st.just(w), mesh_shapes(w))))
def test_mesh_shapes_fit_the_world(case):
    world, shape = case
    assert 1 <= len(shape) <= 5 and all(s >= 1 for s in shape) and math.prod(shape) <= world


@given(st.integers(1, 5).flatmap(dim_names))
def test_dim_names_are_distinct_identifiers(names):
    assert len(set(names)) == len(names) and all(n.isidentifier() for n in names)


@given(st.integers(1, 16).flatmap(lambda w: mesh_shapes(w).flatmap(lambda s: st.tuples(st.just(w), st.just(s),
                                                                                         rank_layouts(w, s)))))
def test_rank_layouts_are_distinct_ranks_of_the_world_in_the_shape(case):
    world, shape, layout = case

    def flat(x):
        return [v for item in x for v in flat(item)] if isinstance(x, list) else [x]

    ranks = flat(layout)
    assert len(ranks) == math.prod(shape) and len(set(ranks)) == len(ranks) and all(0 <= r < world for r in ranks)


@given(plans(8))
def test_generated_plans_are_valid_spmd_plans_that_check_what_they_build(plan):
    validate(plan, 8)
    assert not plan.diverges
    prediction = predict(plan, 8)
    root_failed = len(plan.steps) == 1 and type(prediction.ranks[0].observations[0]).__name__ in ("Err", "Quirk")
    assert any(s.op == "check" for s in plan.steps) or root_failed


@given(plans(4, device="cuda"))
def test_plans_for_an_nccl_cluster_name_only_the_device_its_backend_serves(plan):
    # An NCCL-only default group has no backend for cpu tensors: a cpu mesh there fails its first collective.
    assert all(s.args.get("device") in (None, "cuda", "cuda:0") for s in plan.steps)


@given(divergent_plans(8))
def test_divergent_plans_make_ranks_disagree(plan):
    validate(plan, 8)
    assert plan.diverges


def test_illegal_requests_are_drawn_on_purpose():
    from hypothesis import find

    from meshsim.model import Err

    def raises_somewhere(plan):
        pred = predict(plan, 8)
        return any(isinstance(o, Err) for o in pred.ranks[0].observations)

    assert find(plans(8), raises_somewhere) is not None


@given(plans(8))
def test_no_two_steps_of_a_generated_plan_define_the_same_handle(plan):
    outs = [s.out for s in plan.steps if s.out]
    assert len(outs) == len(set(outs))
