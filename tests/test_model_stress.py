"""The model on plans written to stress it, not drawn by the sweep: every case here is one the model once cried
wolf on (a false alarm, confirmed on torch 2.13), or a torch behaviour it must name as a finding."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim import Plan, step
from meshsim.core.outcome import ERROR, HANG, UNDEFINED
from meshsim.model import dtensor as D
from meshsim.model.expect import Err, Quirk
from meshsim.model.predict import predict
from meshsim.sweep.properties import assert_agrees

MESH_2X2 = step("init_device_mesh", shape=[2, 2], names=["a", "b"], out="m")


def observed(plan, world, rank, index):
    return predict(plan, world).ranks[rank].observations[index]


# ------------------------------------------------------------------------------------------ the model alone


def test_partial_sum_and_partial_avg_together_are_accepted_and_reduced_as_torch_2_13_does():
    plan = Plan((MESH_2X2, step("from_local", mesh="m", local_shape=[2], placements=["P(sum)", "P(avg)"], out="t"),
                 step("full_tensor", tensor="t")))
    whole = observed(plan, 4, 0, 2)
    # rank r holds 4096 * 2**r + [0, 1]: summed over a (ranks 0, 2 / 1, 3), averaged over b
    assert whole["values"] == [(4096 * (1 + 4) + 4096 * (2 + 8)) / 2, (4096 * 15 + 4) / 2]


@pytest.mark.parametrize("ops", [("sum", "max"), ("avg", "min"), ("max", "min")])
def test_partials_with_other_mixes_of_reduce_ops_are_refused_before_any_communication(ops):
    placements = [f"P({op})" for op in ops]
    plan = Plan((MESH_2X2, step("from_local", mesh="m", local_shape=[2], placements=placements, out="t")))
    assert observed(plan, 4, 0, 1) == Err("ValueError", "Mixed Partial reduce types are not supported")


def test_dtensor_steps_that_need_no_communication_run_on_a_mesh_without_a_backend():
    plan = Plan((step("mesh", layout=[0, 1, 2, 3], init_backend=False, out="m"),
                 step("from_local", mesh="m", local_shape=[4], placements=["R"], out="t"),
                 step("redistribute", tensor="t", placements=["S(0)"], out="u"),  # a local chunk
                 step("full_tensor", tensor="t"),  # already whole
                 step("sum", tensor="u", dim=0, out="v"),  # a local sum: Partial(sum)
                 step("full_tensor", tensor="u"),  # an all_gather: needs the groups
                 step("distribute", mesh="m", shape=[4], placements=["R"], out="w")))  # a broadcast
    pred = predict(plan, 4)
    seen = pred.ranks[2].observations
    assert seen[2]["values"] == [4096 * 4 + 2] and seen[3]["values"] == [4096 * 4 + i for i in range(4)]
    assert seen[4]["placements"] == ["P(sum)"]
    assert seen[5] == Err("AttributeError", "_dim_group_names")
    assert seen[6] == Err("RuntimeError", "process groups not initialized")
    assert pred.outcome == "pass"


def test_ranks_that_infer_different_global_shapes_make_the_next_collective_undefined_not_a_pass():
    plan = Plan((step("init_device_mesh", shape=[4], out="m"),
                 step("from_local", mesh="m", local_shape=[2], placements=["S(0)"], on_rank={1: {"local_shape": [3]}},
                      out="t"),
                 step("full_tensor", tensor="t")))
    pred = predict(plan, 4)
    assert pred.outcome == Quirk(ERROR, UNDEFINED, "gloo-size-mismatch-silent")
    assert pred.undefined_from == 2 and pred.culprits == [1]


def test_run_check_broadcasting_blocks_of_other_sizes_is_undefined_too():
    plan = Plan((step("init_device_mesh", shape=[4], out="m"),
                 step("from_local", mesh="m", local_shape=[2], shape=[2], placements=["R"], run_check=True,
                      on_rank={3: {"local_shape": [3]}}, out="t")))
    assert predict(plan, 4).outcome == Quirk(ERROR, UNDEFINED, "gloo-size-mismatch-silent")


def test_blocks_that_agree_in_size_are_not_a_mismatch_whatever_shape_they_claim():
    plan = Plan((step("init_device_mesh", shape=[4], out="m"),
                 step("from_local", mesh="m", local_shape=[2], shape=[9], placements=["S(0)"],
                      on_rank={1: {"local_shape": [3]}}, out="t"),
                 step("full_tensor", tensor="t")))
    pred = predict(plan, 4)
    # every member pads to the full chunk of 9 over 4 (3): gloo sees equal sizes, torch returns padding as data
    assert pred.outcome == "pass"
    assert pred.ranks[0].observations[2]["values"] == [4096, 4097, 0, 8192, 8193, 8194, 16384, 16385, 0]


def test_a_merged_all_gather_on_a_flattened_mesh_loses_uneven_data_and_names_its_finding():
    plan = Plan((MESH_2X2, step("flatten", src="m", out="f"),
                 step("distribute", mesh="m", shape=[5], placements=["S(0)", "S(0)"], out="t"),
                 step("full_tensor", tensor="t")))
    seen = observed(plan, 4, 0, 3)
    assert isinstance(seen, Quirk) and seen.finding == D.MERGED
    # rank 0 passes the source tensor: 4096 + 0, 1, ...
    assert seen.right["values"] == [4096 + i for i in range(5)] and seen.torch["values"] == [4096, 4097, 4098, 0, 4099]


def test_without_the_flattened_mesh_the_same_redistribute_is_right():
    plan = Plan((MESH_2X2, step("distribute", mesh="m", shape=[5], placements=["S(0)", "S(0)"], out="t"),
                 step("full_tensor", tensor="t")))
    assert observed(plan, 4, 0, 2)["values"] == [4096 + i for i in range(5)]


def test_a_merged_reduce_scatter_hands_out_chunks_in_sorted_rank_order_where_the_flattened_order_is_not():
    plan = Plan((step("mesh", layout=[[0, 2], [1, 3]], names=["a", "b"], out="m"), step("flatten", src="m", out="f"),
                 step("from_local", mesh="m", local_shape=[4], placements=["P(sum)", "P(avg)"], out="p"),
                 step("redistribute", tensor="p", placements=["S(0)", "S(0)"], out="q")))
    seen = observed(plan, 4, 1, 3)
    # every dim group is ascending ([0, 1], [0, 2], ...): only the flattened group [0, 2, 1, 3] is not
    assert isinstance(seen, Quirk) and seen.finding == D.MERGED
    assert seen.right["offset"] == seen.torch["offset"] and seen.right["values"] != seen.torch["values"]


def test_the_merge_follows_torchs_plan_ascending_reduce_scatters_descending_all_gathers():
    moves = D.plain_moves([("P", "sum"), ("P", "avg")], [("S", 0), ("S", 0)], (2, 2))
    merged = D.merged_moves(moves, (2, 2), lambda dims: True, [(4,), (4,)])
    assert merged == [D.Move((0, 1), ("P", "sum"), ("S", 0), avg_scale=2, logical_dim=0)]
    uneven = D.merged_moves(moves, (2, 2), lambda dims: True, [(6,), (6,)])  # 6 over 4: torch keeps them apart
    assert uneven == moves
    gathers = D.plain_moves([("S", 0), ("S", 0)], [("R",), ("R",)], (2, 2))
    assert [m.dims for m in gathers] == [(1,), (0,)]
    assert D.merged_moves(gathers, (2, 2), lambda dims: True, [(5,), (3,)])[0].dims == (0, 1)
    assert D.merged_moves(gathers, (2, 2), lambda dims: False, [(5,), (3,)]) == gathers


FROM_GROUP_ROWS_AS_DIM_0 = Plan((
    step("new_group", ranks=[0, 1], out="r0"), step("new_group", ranks=[2, 3], out="r1"),
    step("new_group", ranks=[0, 2], out="c0"), step("new_group", ranks=[1, 3], out="c1"),
    step("from_group", groups=[["r0", "r1"], ["c0", "c1"]], layout=[[0, 1], [2, 3]], names=["x", "y"], out="g"),
    step("distribute", mesh="g", shape=[4], placements=["S(0)", "R"], out="t"),
    step("to_local", tensor="t")))


def test_from_group_with_groups_that_contradict_the_mesh_names_a_finding_for_every_dtensor_value():
    seen = observed(FROM_GROUP_ROWS_AS_DIM_0, 4, 1, 6)
    assert isinstance(seen, Quirk) and seen.finding == D.CONTRADICTED


@pytest.mark.parametrize("placements, dim, after", [
    (["P(avg)", "R"], 0, ["R", "R"]),
    (["P(max)", "S(0)"], 0, ["R", "R"]),  # the summed dim's shard is replicated too
    (["P(max)", "S(0)"], 1, ["R", "S(0)"]),
    (["S(1)", "P(avg)"], 0, ["S(0)", "R"]),
    (["P(sum)", "P(avg)"], 1, ["R", "R"]),
])
def test_sum_of_a_partial_other_than_sum_first_reduces_it_as_torchs_reduction_strategy(placements, dim, after):
    plan = Plan((MESH_2X2, step("from_local", mesh="m", local_shape=[2, 3], placements=placements, out="t"),
                 step("sum", tensor="t", dim=dim, out="u")))
    seen = observed(plan, 4, 0, 2)
    assert seen["placements"] == after


def test_a_model_failure_is_attributed_to_the_step_it_happens_at(monkeypatch):
    from meshsim.check import prediction_for

    def broken(self, rank):
        raise IndexError("seeded")

    monkeypatch.setattr(D.DTensorModel, "observation", broken)
    plan = Plan((MESH_2X2, step("query", mesh="m", what="ndim"),
                 step("distribute", mesh="m", shape=[4], placements=["R", "R"], out="t")))
    prediction = prediction_for(plan, 4, 10)
    assert prediction.model_error_step == 2 and "seeded" in prediction.model_error


@st.composite
def uneven_blocks(draw):
    """from_local blocks whose sizes each rank chooses itself, then a collective: the model must say whether
    gloo sees equal sizes (a prediction) or not (undefined), never predict a pass torch cannot give."""
    sizes = draw(st.lists(st.integers(0, 3), min_size=4, max_size=4))
    shape = draw(st.one_of(st.none(), st.integers(0, 12)))
    extra = {"shape": [shape]} if shape is not None else {}
    placement = draw(st.sampled_from(["S(0)", "R", "P(sum)"]))
    target = draw(st.sampled_from(["R", "S(0)"]))
    return Plan((step("init_device_mesh", shape=[4], out="m"),
                 step("from_local", mesh="m", local_shape=[sizes[0]], placements=[placement], out="t",
                      on_rank={r: {"local_shape": [n]} for r, n in enumerate(sizes) if r}, **extra),
                 step("redistribute", tensor="t", placements=[target], out="u"),
                 step("to_local", tensor="u")))


@given(uneven_blocks())
@settings(max_examples=60, deadline=None)
def test_a_collective_of_blocks_that_differ_in_size_is_predicted_undefined_exactly_when_gloo_sees_it(plan):
    pred = predict(plan, 4)
    sent = set()
    from_local, redistribute = plan.steps[1], plan.steps[2]
    placement, target = from_local.args["placements"][0], redistribute.args["placements"][0]
    for r in range(4):
        n = from_local.args_for(r)["local_shape"][0]
        size = from_local.args.get("shape", [n * (4 if placement == "S(0)" else 1)])[0]
        if placement == "S(0)" and target == "R":
            sent.add(-(-size // 4) if size % 4 else n)
        elif placement == "P(sum)" and target == "R":
            sent.add(n)
        elif placement == "P(sum)" and target == "S(0)":
            sent.add(-(-n // 4) * 4 if n % 4 else n)
    mismatch = len(sent) > 1
    assert (pred.outcome == Quirk(ERROR, UNDEFINED, "gloo-size-mismatch-silent")) == mismatch, plan.describe()


# ------------------------------------------------------------------------------------------ on real ranks

STRESS_PLANS = {
    "sum-and-avg-partials": Plan((
        MESH_2X2, step("from_local", mesh="m", local_shape=[2], placements=["P(sum)", "P(avg)"], out="t"),
        step("full_tensor", tensor="t"), step("redistribute", tensor="t", placements=["R", "S(0)"], out="u"),
        step("to_local", tensor="u"))),
    "no-backend": Plan((  # over ranks 0-3: the others return empty DTensors without asking for groups
        step("mesh", layout=[0, 1, 2, 3], init_backend=False, out="m"),
        step("from_local", mesh="m", local_shape=[4], placements=["R"], out="t"),
        step("redistribute", tensor="t", placements=["S(0)"], out="u"), step("to_local", tensor="u"),
        step("full_tensor", tensor="t"), step("sum", tensor="u", dim=0, out="v"), step("to_local", tensor="v"),
        step("full_tensor", tensor="u"), step("distribute", mesh="m", shape=[4], placements=["R"], out="w"),
        step("mesh", layout=list(range(8)), init_backend=False, out="n"),  # run_check gathers over the world
        step("from_local", mesh="n", local_shape=[4], placements=["S(0)"], run_check=True, out="x"),
        step("from_local", mesh="n", local_shape=[4], placements=["R"], run_check=True, out="y"))),
    "merged-uneven": Plan((
        MESH_2X2, step("flatten", src="m", out="f"),
        step("distribute", mesh="m", shape=[5, 2], placements=["S(0)", "S(0)"], out="t"),
        step("full_tensor", tensor="t"))),
    "merged-order": Plan((
        step("mesh", layout=[[0, 2], [1, 3]], names=["a", "b"], out="m"), step("flatten", src="m", out="f"),
        step("distribute", mesh="m", shape=[4], placements=["S(0)", "S(0)"], out="t"), step("full_tensor", tensor="t"),
        step("from_local", mesh="m", local_shape=[4], placements=["P(sum)", "P(avg)"], out="p"),
        step("redistribute", tensor="p", placements=["S(0)", "S(0)"], out="q"), step("to_local", tensor="q"))),
    "sum-of-partials": Plan((
        MESH_2X2, step("from_local", mesh="m", local_shape=[2, 3], placements=["P(max)", "S(0)"], out="t"),
        step("sum", tensor="t", dim=0, out="u"), step("to_local", tensor="u"),
        step("sum", tensor="t", dim=1, out="v"), step("to_local", tensor="v"),
        step("from_local", mesh="m", local_shape=[2, 3], placements=["S(1)", "P(avg)"], out="w"),
        step("sum", tensor="w", dim=1, out="x"), step("to_local", tensor="x"))),
    "from-group-contradicting": FROM_GROUP_ROWS_AS_DIM_0,
}


@pytest.mark.parametrize("name", sorted(STRESS_PLANS))
def test_a_plan_written_to_stress_the_model_runs_without_a_false_alarm(meshsim_cluster, name):
    assert_agrees(meshsim_cluster, STRESS_PLANS[name])


def test_a_hang_from_crossed_group_names_has_the_same_culprits_on_every_run(meshsim_cluster):
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["dp", "tp"], out="m"),
                 step("from_group", src="m", dims=["tp"], out="t"),
                 step("unflatten", src="t", dim=0, sizes=[2, 2], names=["a", "b"], out="u"),
                 step("check", mesh="u")))
    # 6 s: the ranks must reach the hang (mesh, from_group, unflatten) before the deadline on a loaded machine
    runs = [meshsim_cluster.run(plan, deadline=6) for _ in range(2)]
    assert all(r.passed and r.outcome == HANG for r in runs), "\n".join(r.report() for r in runs)
    assert runs[0].culprits == runs[1].culprits == predict(plan, 8).collided == list(range(8))
    assert "group-name-collision" in runs[0].findings


@st.composite
def stress_plans(draw):
    """Families the generator does not draw, each from a false alarm the model once raised: blocks whose sizes each
    rank picks, Partial pairs with different reduce ops, a mesh built without a backend, a flattened root under a
    DTensor, a sum of a Partial torch must reduce first."""
    family = draw(st.sampled_from(["sizes", "pairs", "no-backend", "flattened", "sum"]))
    m = step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m")
    if family == "sizes":
        sizes = draw(st.lists(st.integers(1, 3), min_size=8, max_size=8))
        placement = draw(st.sampled_from(["S(0)", "P(sum)", "R"]))
        return Plan((step("init_device_mesh", shape=[8], out="m"),
                     step("from_local", mesh="m", local_shape=[sizes[0]], placements=[placement], out="t",
                          on_rank={r: {"local_shape": [n]} for r, n in enumerate(sizes) if r}),
                     step("redistribute", tensor="t", placements=[draw(st.sampled_from(["R", "S(0)"]))], out="u"),
                     step("to_local", tensor="u")))
    if family == "pairs":
        ops = draw(st.sampled_from([("sum", "avg"), ("avg", "sum"), ("sum", "max"), ("min", "min")]))
        target = draw(st.lists(st.sampled_from(["R", "S(0)", "S(1)"]), min_size=2, max_size=2))
        return Plan((m, step("from_local", mesh="m", local_shape=[2, 3], placements=[f"P({o})" for o in ops], out="t"),
                     step("redistribute", tensor="t", placements=target, out="u"), step("full_tensor", tensor="u")))
    if family == "no-backend":
        target = draw(st.sampled_from(["S(0)", "R"]))
        return Plan((step("mesh", layout=list(range(8)), init_backend=False, out="m"),
                     step("from_local", mesh="m", local_shape=[4], placements=[draw(st.sampled_from(["R", "S(0)"]))],
                          out="t"),
                     step("redistribute", tensor="t", placements=[target], out="u"), step("to_local", tensor="u"),
                     step("sum", tensor="u", dim=0, out="v"), step("to_local", tensor="v")))
    if family == "flattened":
        size = draw(st.integers(1, 9))
        placements = draw(st.sampled_from([["S(0)", "S(0)"], ["P(sum)", "P(avg)"], ["P(max)", "P(max)"]]))
        make = step("distribute", mesh="m", shape=[size], placements=placements, out="t") if placements[0][0] == "S" \
            else step("from_local", mesh="m", local_shape=[size], placements=placements, out="t")
        return Plan((m, step("flatten", src="m", out="f"), make,
                     step("redistribute", tensor="t", placements=draw(st.sampled_from([["R", "R"], ["S(0)", "S(0)"]])),
                          out="u"), step("to_local", tensor="u")))
    placements = draw(st.sampled_from([["P(avg)", "S(1)"], ["P(max)", "P(max)"], ["S(0)", "P(min)"]]))
    return Plan((m, step("from_local", mesh="m", local_shape=[2, 3], placements=placements, out="t"),
                 step("sum", tensor="t", dim=draw(st.integers(0, 1)), out="s"), step("to_local", tensor="s")))


def test_plans_written_to_stress_the_model_agree_with_torch_or_name_their_finding(meshsim_cluster):
    from meshsim.sweep.properties import check_property

    check_property(meshsim_cluster, stress_plans(), max_examples=12)
