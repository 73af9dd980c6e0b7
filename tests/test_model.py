"""The reference model on its own: DeviceMesh's documented examples, its errors, findings and hangs.

No processes, no torch: these run in milliseconds.
"""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.model import Err, Quirk, torch_side
from meshsim.model.predict import predict, predict_rank
from meshsim.spec.plan import Plan, step
from meshsim.sweep.strategies import plans

W = 8


def observe(plan_steps, rank, index=-1, world=W):
    return predict(Plan(tuple(plan_steps)), world).ranks[rank].observations[index]


MESH_2D = step("init_device_mesh", shape=[2, 4], names=["dp", "tp"], out="m")
MESH_3D = step("init_device_mesh", shape=[2, 2, 2], names=["dp", "cp", "tp"], out="m")


def test_the_model_imports_no_torch():
    code = ("import sys, meshsim.model, meshsim.spec, meshsim.ops, meshsim.sweep.strategies, meshsim.judge.verdict, "
            "meshsim.check; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("rank", range(W))
def test_tp_slice_of_a_2x4_mesh_is_the_ranks_host_row(rank):
    obs = observe([MESH_2D, step("slice", src="m", names="tp", out="t")], rank)
    assert obs["mesh"] == ([0, 1, 2, 3] if rank < 4 else [4, 5, 6, 7])


@pytest.mark.parametrize("rank", [1, 5])
def test_dp_slice_on_ranks_1_and_5_is_1_5(rank):
    assert observe([MESH_2D, step("slice", src="m", names="dp", out="d")], rank)["mesh"] == [1, 5]


@pytest.mark.parametrize("rank", range(W))
def test_get_local_rank_matches_the_docstring(rank):
    dim0 = observe([MESH_2D, step("query", mesh="m", what="get_local_rank", dim=0)], rank)
    dim1 = observe([MESH_2D, step("query", mesh="m", what="get_local_rank", dim=1)], rank)
    assert dim0 == (0 if rank < 4 else 1)
    assert dim1 == rank % 4


@pytest.mark.parametrize("rank, expected", [(0, [[0, 1], [4, 5]]), (5, [[0, 1], [4, 5]]), (2, [[2, 3], [6, 7]])])
def test_3d_slice_keeps_outer_dim_first(rank, expected):
    plan = [step("init_device_mesh", shape=[2, 2, 2], names=["dp", "pp", "cp"], out="m"),
            step("slice", src="m", names=["dp", "cp"], out="s")]
    assert observe(plan, rank)["mesh"] == expected


def test_3d_slice_in_descending_order_raises_as_the_code_does_not_as_the_docstring_says():
    plan = [step("init_device_mesh", shape=[2, 2, 2], names=["dp", "pp", "cp"], out="m"),
            step("slice", src="m", names=["cp", "dp"], out="s")]
    expected = observe(plan, 0)
    assert isinstance(expected, Quirk) and expected.finding == "slice-order-docstring"
    assert expected.torch == Err("KeyError", "Mesh dim indices should be in ascending order")


@pytest.mark.parametrize("rank, expected", [(0, [0, 2, 4, 6]), (6, [0, 2, 4, 6]), (1, [1, 3, 5, 7])])
def test_flatten_of_dp_cp_matches_the_docstring(rank, expected):
    plan = [MESH_3D, step("slice", src="m", names=["dp", "cp"], out="s"), step("flatten", src="s", out="f")]
    obs = observe(plan, rank)
    assert obs["mesh"] == expected and obs["names"] == ["dp_cp"]


def test_flattening_again_with_the_same_name_and_layout_creates_no_groups():
    plan = [MESH_3D, step("slice", src="m", names=["dp", "cp"], out="s"), step("flatten", src="s", out="f"),
            step("flatten", src="s", out="g")]
    pred = predict(Plan(tuple(plan)), W)
    creations = [c for c in pred.ranks[0].calls if c.kind == "create"]
    assert {c.step for c in creations} == {0, 2}


def test_flatten_name_clash_raises_value_error():
    plan = [MESH_3D, step("slice", src="m", names=["dp", "cp"], out="s"), step("flatten", src="s", name="tp", out="f")]
    assert observe(plan, 0) == Err("ValueError", "already exists for submesh of the")


def test_unflatten_of_a_1d_world_mesh():
    plan = [step("init_device_mesh", shape=[8], names=["w"], out="m"),
            step("unflatten", src="m", dim=0, sizes=[2, 4], names=["a", "b"], out="u")]
    assert observe(plan, 3)["mesh"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("bad, err", [
    (step("init_device_mesh", shape=[3, 3], out="x", expect_error=True),
     Err("RuntimeError", "Mesh should not be bigger than default world size")),
    (step("init_device_mesh", shape=[2, 4], names=["a", "a"], out="x"), Err("RuntimeError", "must be unique")),
    (step("slice", src="m", names=["dp", "dp"], out="x"), Err("RuntimeError", "Slicing overlapping dim_names")),
    (step("slice", src="m", names=["zz"], out="x"), Err("KeyError", "Valid mesh_dim_names are")),
    (step("unflatten", src="m", dim="tp", sizes=[3, 2], names=["a", "b"], out="x"), Err("ValueError", "must be equal")),
    (step("all_submeshes", src="m", dim="zz", out="x"), Err("KeyError", "does not exist")),
    (step("query", mesh="m", what="get_group"), Err("RuntimeError", "Found the DeviceMesh have")),
])
def test_illegal_requests_predict_the_error_torch_raises(bad, err):
    got = observe([MESH_2D, bad], 0)
    assert isinstance(got, Err) and got.type == err.type and err.match in got.match


def test_size_one_dims_drop_out_of_the_slice_order_check():
    plan = [step("init_device_mesh", shape=[2, 1, 4], names=["p", "q", "r"], out="m"),
            step("slice", src="m", names=["r", "q"], out="s")]
    assert observe(plan, 5)["shape"] == [4, 1]


def test_ranks_outside_a_subset_mesh_have_no_coordinate_and_no_group():
    plan = [step("init_device_mesh", shape=[3], names=["x"], out="m"), step("check", mesh="m")]
    obs = observe(plan, 5)
    assert obs["coordinate"] is None
    assert obs["dims"][0]["group"] == Err("IndexError", "list index out of range")


def test_non_monotonic_layout_local_rank_is_a_finding():
    plan = [step("mesh", layout=[[7, 6, 5, 4], [3, 2, 1, 0]], names=["dp", "tp"], out="m"),
            step("query", mesh="m", what="get_local_rank", dim="tp")]
    expected = observe(plan, 6)
    assert expected == Quirk(right=1, torch=2, finding="group-rank-order")


def test_a_repeated_rank_should_be_refused_and_torch_derails():
    plan = Plan((step("mesh", layout=[[0, 1], [1, 2]], names=["a", "b"], out="m"),
                 step("init_device_mesh", shape=[2, 4], out="n")))
    pred = predict(plan, 4 * 2)
    assert "repeated-rank-accepted" in pred.findings
    assert isinstance(pred.outcome, Quirk) and pred.outcome.right == "pass"


def test_skipping_a_subgroup_all_reduce_is_predicted_to_hang_with_the_skipper_as_culprit():
    plan = Plan((MESH_2D, step("all_reduce", mesh="m", dim="tp", skip_on=[5]), step("check", mesh="m")))
    pred = predict(plan, W)
    assert pred.outcome == "hang" and pred.culprits == [5]
    assert {s.rank for s in pred.stuck} >= {4, 6, 7}


def test_a_different_shape_on_one_rank_is_predicted_to_hang():
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m", on_rank={3: {"shape": [4, 2]}}),
                 step("check", mesh="m")))
    pred = predict(plan, W)
    assert pred.outcome == "hang" and pred.culprits == [3]


@pytest.mark.parametrize("fault, outcome", [("exit", "crash"), ("kill", "crash"), ("raise", "error")])
def test_faults_predict_their_outcome(fault, outcome):
    plan = Plan((MESH_2D, step(fault, only_on=[2]), step("check", mesh="m")))
    pred = predict(plan, W)
    assert pred.outcome == outcome and pred.culprits == [2]


@pytest.mark.parametrize("seconds, outcome", [(0.5, "pass"), (9.0, "hang")])
def test_a_straggler_hangs_only_past_the_deadline(seconds, outcome):
    plan = Plan((MESH_2D, step("sleep", seconds=seconds, only_on=[6]), step("check", mesh="m")))
    assert predict(plan, W, deadline=5.0).outcome == outcome


def test_from_group_then_unflatten_collides_group_names():
    plan = Plan((MESH_2D, step("from_group", src="m", dims=["tp"], out="t"),
                 step("unflatten", src="t", dim=0, sizes=[2, 2], names=["a", "b"], out="u")))
    pred = predict(plan, W)
    assert pred.undefined_from == 2 and "group-name-collision" in pred.findings


def test_check_sees_membership_order_and_broadcast_source_on_every_dim():
    obs = torch_side(observe([MESH_2D, step("check", mesh="m")], 6))
    assert obs["coordinate"] == [1, 2]
    dp, tp = obs["dims"]
    assert dp["all_reduce"] == [2, 6] and dp["all_gather"] == [2, 6] and dp["broadcast"] == 2
    assert tp["group"] == [4, 5, 6, 7] and tp["local_rank"] == 2 and tp["broadcast"] == 4


def test_the_model_answers_for_one_rank_of_a_100k_rank_world():
    plan = Plan((step("init_device_mesh", shape=[25, 4, 1000], names=["pp", "dp", "tp"], out="m"),
                 step("slice", src="m", names=["pp", "tp"], out="s"), step("check", mesh="s", collectives=False)))
    obs = torch_side(predict_rank(plan, 100_000, 99_999)[2])
    assert obs["coordinate"] == [24, 999]
    assert obs["dims"][0]["group"][:3] == [3999, 7999, 11999]


def test_a_rank_that_dies_right_after_making_groups_leaves_its_peers_unpredictable_from_that_step():
    # Its peers may still be connecting the groups it made when it dies (gloo: "Connection closed by peer"),
    # so their observations of the group-making step are not the model's to predict.
    plan = Plan((MESH_2D, step("kill", only_on=[2]), step("check", mesh="m")))
    pred = predict(plan, W)
    assert pred.outcome == "crash" and pred.culprits == [2] and pred.undefined_from == 0
    survivor = Plan((MESH_2D, step("query", mesh="m", what="ndim"), step("kill", only_on=[2])))
    assert predict(survivor, W).undefined_from == 0  # its last call was still in step 0


@settings(max_examples=300, database=None)
@given(st.sampled_from([1, 2, 4, 6, 8]).flatmap(lambda w: st.tuples(st.just(w), plans(w, max_steps=10))))
def test_the_model_never_raises_on_any_drawn_plan(world_and_plan):
    world, plan = world_and_plan
    prediction = predict(plan, world)  # an exception here would be the model's own bug
    assert len(prediction.ranks) == world


def test_a_model_bug_becomes_a_verdict_not_a_traceback(monkeypatch):
    from meshsim.check import prediction_for
    from meshsim.model import mesh as model_mesh

    def broken(*args, **kwargs):
        raise ZeroDivisionError("seeded")

    monkeypatch.setattr(model_mesh.RankModel, "init_device_mesh", broken)
    prediction = prediction_for(Plan((step("init_device_mesh", shape=[2, 4], out="m"),)), W, 5.0)
    assert prediction.model_error == "the model cannot predict this plan: ZeroDivisionError: seeded"


@pytest.mark.parametrize("steps, rank, expected", [
    # _unflatten(-1): torch keeps the last dim and refuses the layout; right: a (2, 2, 2) mesh
    ([step("unflatten", src="m", dim=-1, sizes=[2, 2], names=["c", "d"], out="u")], 0,
     ("unflatten-negative-dim", Err("AssertionError", "Please use a non-overlapping layout"))),
    # a submesh answers get_group for a flattened dim of its root that it does not have
    ([step("flatten", src="m", name="f", out="f"), step("slice", src="m", names="b", out="s"),
      step("query", mesh="s", what="get_group", dim="f")], 5,
     ("get-group-foreign-flattened-name", list(range(8)))),
])
def test_registered_findings_carry_torchs_side(steps, rank, expected):
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m"), *steps))
    observed = predict(plan, W).ranks[rank].observations[-1]
    assert isinstance(observed, Quirk) and (observed.finding, observed.torch) == expected


def test_concatenating_disjoint_but_interleaved_dims_is_refused_like_torch():
    plan = Plan((step("init_device_mesh", shape=[6], names=["w"], out="m"),
                 step("unflatten", src="m", dim=0, sizes=[2, 3], names=["a", "b"], out="u1"),
                 step("unflatten", src="m", dim=0, sizes=[3, 2], names=["c", "d"], out="u2"),
                 step("slice", src="u1", names="a", out="s1"), step("slice", src="u2", names="c", out="s2"),
                 step("concatenate", srcs=["s1", "s2"], out="cc")))
    assert predict(plan, 6).ranks[0].observations[-1] == Err("RuntimeError", "Cannot concatenate overlapping meshes")


def test_a_cuda_mesh_fails_to_build_only_where_no_rank_can_set_a_cuda_device():
    from meshsim.model.mesh import Platform

    plan = Plan((step("init_device_mesh", shape=[2, 4], device="cuda", out="m"),))
    assert predict(plan, W).ranks[0].observations[0] == Err(None, "cuda")
    assert predict(plan, W, platform=Platform("cuda", True)).ranks[0].observations[0]["shape"] == [2, 4]


def test_from_local_onto_a_slice_of_its_sources_mesh_is_predicted_where_values_are_not_simulated():
    """Past 1,024 ranks the model keeps shapes alone: the local block from_local takes is the source's, placed on
    the source's mesh (three dims here), not on the slice it goes to (two). Found by the README's fake-tier sweep."""
    plan = Plan((step("init_device_mesh", shape=[1, 1, 2048], names=["a", "b", "c"], out="m"),
                 step("distribute", mesh="m", shape=[1], placements=["R", "R", "S(0)"], out="t"),
                 step("slice", src="m", names=["b", "c"], out="v"),
                 step("from_local", mesh="v", tensor="t", placements=["R", "R"], out="u"),
                 step("full_tensor", tensor="u")))
    for rank in (0, 2047):
        made, whole = predict_rank(plan, 2048, rank)[3:5]
        local = [1] if rank == 0 else [0]  # Shard(0) of one element over 2,048 ranks: rank 0 holds it
        assert made["local_shape"] == local and made["shape"] == local and whole["shape"] == local


@pytest.mark.parametrize("shape, outside", [(None, "error"), ([0, 0], "dtensor"), ([4], "dtensor")])
def test_from_local_checks_shard_dims_as_torch_does_on_ranks_outside_the_mesh(shape, outside):
    """Measured on torch 2.13: without `shape` from_local infers the global shape on every rank, so Shard(1) of a
    1-D block raises on members and non-members alike; with `shape` torch trusts the caller, and a rank outside the
    mesh (its block is the empty 1-D tensor a non-member holds) gets a DTensor whatever the placements say."""
    given = {} if shape is None else {"shape": shape}
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="w"),
                 step("distribute", mesh="w", shape=[4], placements=["S(0)", "R"], out="t"),
                 step("mesh", layout=[[[0]], [[1]]], out="m"),
                 step("from_local", mesh="m", tensor="t", placements=["R", "R", "S(1)"], out="v", **given)))
    made = predict_rank(plan, 8, 5)[3]
    if outside == "error":
        assert isinstance(made, Err)
    else:
        assert made["shape"] == shape and made["local_shape"] == [0] and made["values"] == []


def test_past_1024_ranks_a_full_tensor_with_nothing_to_gather_leaves_its_layout_unclaimed():
    """full_tensor of a Replicate DTensor hands the block back as it is (a Shard -> Shard move's block may be a
    view): its contiguity is not simulated, where a gather's fresh tensor is contiguous. Found by the README's
    fake-tier sweep at 4,096 ranks."""
    from meshsim.core.wire import NOT_SIMULATED

    plan = Plan((step("init_device_mesh", shape=[1024, 2], names=["a", "b"], out="m"),
                 step("distribute", mesh="m", shape=[3], placements=["R", "R"], out="r"),
                 step("full_tensor", tensor="r"),
                 step("distribute", mesh="m", shape=[3], placements=["R", "S(0)"], out="s"),
                 step("full_tensor", tensor="s")))
    seen = predict_rank(plan, 2048, 5)
    assert seen[2]["contiguous"] == NOT_SIMULATED and seen[4]["contiguous"] is True


@pytest.mark.parametrize("release, outside", [((2, 9, 1), "IndexError"), ((2, 10, 0), "IndexError"),
                                              ((2, 11, 0), None), ((2, 13, 0), None)])
def test_a_rank_outside_a_2d_mesh_slices_it_from_2_11_and_raised_before(release, outside):
    """Measured on every release: 2.9 and 2.10 indexed the non-member's empty list of dim groups."""
    from meshsim.spec.platform import Platform

    plan = Plan((step("mesh", layout=[[0], [1], [2], [3]], names=["dp", "tp"], out="m"),
                 step("slice", src="m", names=["dp"], out="s")))
    seen = predict(plan, 8, platform=Platform(release=release)).ranks[5].observations[1]
    assert (seen.type if isinstance(seen, Err) else None) == outside, seen


def _reversed_concatenation_gathered(order: list[str], release: tuple[int, int, int] = (2, 13, 0)) -> object:
    """full_tensor() of a [S(0), S(0)] DTensor on the concatenation of a (4, 1, 2) root's dp and cp slices."""
    from meshsim.spec.platform import Platform

    plan = Plan((step("init_device_mesh", shape=[4, 1, 2], names=["dp", "tp", "cp"], out="m"),
                 step("slice", src="m", names="dp", out="dp"), step("slice", src="m", names="cp", out="cp"),
                 step("concatenate", srcs=order, out="c"),
                 step("distribute", mesh="c", shape=[8], placements=["S(0)", "S(0)"], out="t"),
                 step("full_tensor", tensor="t")))
    return predict(plan, W, platform=Platform(release=release)).ranks[3].observations[-1]


def test_a_merge_torch_looks_up_on_a_mesh_out_of_root_order_raises_keyerror_where_the_right_value_is_the_tensor():
    observed = _reversed_concatenation_gathered(["cp", "dp"])
    assert isinstance(observed, Quirk) and observed.finding == "dtensor-merge-lookup-refuses-unsorted-mesh"
    assert observed.torch == Err("KeyError", "Mesh dim indices should be in ascending order")
    assert observed.right["shape"] == [8] and observed.right["values"] == _reversed_concatenation_gathered(
        ["dp", "cp"])["values"]  # in root order torch gathers the same tensor, with no finding
    # before 2.11 torch merged nothing, so it looked nothing up
    assert not isinstance(_reversed_concatenation_gathered(["cp", "dp"], (2, 10, 0)), Quirk)
