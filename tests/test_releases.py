"""The model follows the torch release the ranks run (meshsim.model.semantics), tells torch's choices from what torch
must do (meshsim.model.choices), and refuses, in one line, what a release lacks. Pure: no torch runs here."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim import Plan, step
from meshsim.core.releases import KNOWN, parse, text
from meshsim.model.expect import Err, Quirk
from meshsim.model.predict import predict
from meshsim.model.semantics import RULES, holds, needs
from meshsim.ops import validate
from meshsim.spec.fields import PlanError
from meshsim.spec.platform import Platform
from meshsim.sweep.strategies import matrix_plans, plans

OLDEST, NEWEST = Platform(release=(2, 9, 1)), Platform(release=(2, 15, 0))


def observed(plan, platform, step_index, rank=0, world=8, **kwargs):
    return predict(plan, world, platform=platform, **kwargs).expected(rank, step_index)


def test_a_release_is_read_from_its_version_text_whatever_its_build():
    assert parse("2.15.0+cu132") == (2, 15, 0) and parse("2.16.0a0+git1234") == (2, 16, 0)
    assert text(parse("2.9")) == "2.9.0"
    assert KNOWN[0] == (2, 9, 1) and KNOWN[-1] == (2, 15, 0)


def test_a_step_a_release_lacks_is_refused_in_one_line_naming_both_releases():
    plan = Plan((step("init_device_mesh", shape=[8], names=["a"], out="m"),
                 step("unflatten", src="m", dim=0, sizes=[2, 4], names=["x", "y"], out="u")))
    with pytest.raises(PlanError, match=r"^step 1 \(unflatten\): needs torch >= 2\.10\.0; this is 2\.9\.1"):
        validate(plan, 8, OLDEST)
    validate(plan, 8, Platform(release=(2, 10, 0)))


def test_a_keyword_a_release_lacks_is_refused_too():
    plan = Plan((step("mesh", layout=[[1, 0]], preserve_rank_order=True, out="m"),))
    with pytest.raises(PlanError, match=r"needs torch >= 2\.15\.0; this is 2\.14\.1"):
        validate(plan, 2, Platform(release=(2, 14, 1)))
    validate(plan, 2, NEWEST)


@given(data=st.data(), release=st.sampled_from(KNOWN))
@settings(max_examples=40, deadline=None)
def test_plans_drawn_for_a_release_use_only_what_it_has(data, release):
    platform = Platform(release=release)
    validate(data.draw(plans(8, platform=platform)), 8, platform)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_plans_drawn_for_torch_2_9_hold_no_tensor_with_a_size_0_dim(data):
    plan = data.draw(plans(8, platform=OLDEST))
    for st_ in plan.steps:
        shape = st_.args.get("shape") if st_.op == "distribute" else st_.args.get("local_shape")
        assert 0 not in (shape or []), st_


@pytest.mark.parametrize(("shape", "placements", "fails_on_2_9"), [
    ([3, 0], ["S(0)"], True), ([1, 0, 2], ["S(0)"], True), ([8, 0], ["S(0)"], False), ([0, 2], ["S(0)"], False),
    ([2, 0], ["S(1)"], False)])
def test_distributing_a_short_shard_of_a_tensor_with_a_size_0_dim_after_it_fails_on_torch_2_9_only(
        shape, placements, fails_on_2_9):
    plan = Plan((step("init_device_mesh", shape=[8], names=["a"], out="m"),
                 step("distribute", mesh="m", shape=shape, placements=placements, out="x")))
    failed = Err("RuntimeError", "The input size 0, plus negative padding")
    assert (observed(plan, OLDEST, 1, rank=3) == failed) == fails_on_2_9
    assert observed(plan, Platform(release=(2, 10, 0)), 1, rank=3) != failed


def test_gathering_nested_uneven_shards_hangs_on_torch_2_9_where_the_ranks_with_an_empty_shard_fail_to_pad_it():
    """[1, 1] sharded on both dims of a 2 x 4 mesh: 2.9 pads each rank's shard to the full chunk before the gather,
    and F.pad refuses the shards of shape [0, 0] (ranks 5-7), which raise while their peers wait in the gather."""
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m"),
                 step("distribute", mesh="m", shape=[1, 1], placements=["R", "S(0)"], out="t"),
                 step("redistribute", tensor="t", placements=["S(0)", "S(0)"], out="u"),
                 step("redistribute", tensor="u", placements=["S(1)", "S(0)"], out="v"),
                 step("full_tensor", tensor="v")))
    failed = Err("RuntimeError", "The input size 0, plus negative padding")
    oldest = predict(plan, 8, platform=OLDEST)
    assert oldest.outcome == "hang"
    assert [r for r in range(8) if oldest.expected(r, 4) == failed] == [5, 6, 7]
    # 4 waits for them in the gather on mesh dim 'b', 1-3 in the gather on 'a' and 0 there with 4
    assert sorted(s.rank for s in oldest.stuck) == [0, 1, 2, 3, 4]
    newer = predict(plan, 8, platform=Platform(release=(2, 10, 0)))
    assert newer.outcome == "pass" and newer.expected(5, 4)["values"] == [4096]


@pytest.mark.parametrize(("names", "refused_on_2_9"), [
    (["ep", "pp"], True), (["pp", "ep"], False), (["ab", "c"], False), (["c", "ab"], True), (["b", "ab"], True)])
def test_torch_2_9_orders_a_slice_by_its_names_where_later_releases_order_it_by_the_layout(names, refused_on_2_9):
    """Out of order on dims of size 1 (and a flattened name at its last root dim): 2.9 refuses it, 2.10 on compare
    the layouts, in which a size-1 dim has no place."""
    plan = Plan((step("init_device_mesh", shape=[2, 2, 2, 1, 1], names=["a", "b", "c", "pp", "ep"], out="m"),
                 step("slice", src="m", names=["a", "b"], out="s"),
                 step("flatten", src="s", name="ab", out="f"),
                 step("slice", src="m", names=names, out="x")))
    refused = Err("KeyError", "Invalid mesh_dim_names")
    oldest = observed(plan, OLDEST, 3)  # (a Quirk: out of order, as the docstring's example, slice-order-docstring)
    assert (getattr(oldest, "torch", oldest) == refused) == refused_on_2_9
    if not {"b", "ab"} <= set(names):  # (overlapping: every release refuses it)
        assert observed(plan, Platform(release=(2, 10, 0)), 3) != refused


@pytest.mark.parametrize(("claimed", "on_2_11", "from_2_12"), [
    ([8], [4096, 4097, 65536, 65537], Err("RuntimeError", "Expected cond to be True")),
    ([2], [4096, 4097, 65536, 65537], Err("RuntimeError", "narrow unexpectedly changed")),
    ([1], [4096], [4096])])  # (a pad of -1 a rank: the two rows the gather brings are the one claimed)
def test_gathering_shards_that_do_not_add_up_to_their_claimed_shape_keeps_the_gather_before_2_12_and_fails_after(
        claimed, on_2_11, from_2_12):
    """Two rows a rank on dim 'a' of 2 x 4, claimed to make `claimed`: torch pads each to the claimed full chunk
    (a negative pad cuts a row off, as F.pad does), gathers and unpads; from 2.12 a result of another size than
    the claimed one fails (measured on 2.9.1, 2.11.0, 2.12.1, 2.13.0, 2.15.0)."""
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m"),
                 step("from_local", mesh="m", local_shape=[2], placements=["S(0)", "R"], shape=claimed, out="t"),
                 step("full_tensor", tensor="t")))
    assert observed(plan, Platform(release=(2, 11, 0)), 2)["values"] == on_2_11
    later = observed(plan, Platform(release=(2, 12, 1)), 2)
    assert (later["values"] if isinstance(from_2_12, list) else later) == from_2_12
    assert predict(plan, 8, platform=Platform(release=(2, 12, 1))).outcome == "pass"  # every member fails alike


def test_the_matrix_plans_leave_out_what_the_installed_release_lacks_and_stay_valid():
    for plan in matrix_plans(8):
        validate(plan, 8)


def test_every_rule_says_where_it_holds_and_a_forced_rule_wins_over_the_release():
    for rule in RULES.values():
        assert rule.since is not None or rule.until is not None, rule.id
        assert holds(rule.id, Platform(release=(2, 15, 0), forced=((rule.id, False),))) is False
    assert needs("mesh-layout", (2, 10, 0)) is None


def test_torch_before_2_10_refuses_slicing_a_dim_twice_with_a_key_error_and_later_with_a_runtime_error():
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m"),
                 step("slice", src="m", names=["a", "a"], out="s")))
    assert observed(plan, OLDEST, 1) == Err("KeyError", "Invalid mesh_dim_names")
    assert observed(plan, NEWEST, 1) == Err("RuntimeError", "Slicing overlapping dim_names")


def test_redistribute_to_a_partial_is_refused_before_2_10_kept_after_and_made_from_a_shard_from_2_14():
    plan = Plan((step("init_device_mesh", shape=[8], names=["a"], out="m"),
                 step("distribute", mesh="m", shape=[5], placements=["S(0)"], out="t"),
                 step("redistribute", tensor="t", placements=["P(sum)"], out="p"),
                 step("full_tensor", tensor="p")))
    assert observed(plan, Platform(release=(2, 13, 0)), 2).type == "RuntimeError"
    # distribute sends rank 0's tensor, 4096 + 0, 1, 2, ...: rank 0's shard is element 0, zeros elsewhere
    assert observed(plan, Platform(release=(2, 14, 1)), 2)["values"] == [4096, 0, 0, 0, 0]
    on_rank_1 = observed(plan, Platform(release=(2, 14, 1)), 2, rank=1)["values"]
    assert on_rank_1 == [0, 4097, 0, 0, 0]  # rank 1 holds element 1 of 5 over 8 ranks, zeros elsewhere
    assert observed(plan, Platform(release=(2, 14, 1)), 3)["values"] == [4096, 4097, 4098, 4099, 4100]  # the tensor


def test_a_mesh_that_preserves_its_rank_order_has_groups_in_mesh_order_and_no_group_rank_order_finding():
    layout = [[7, 6, 5, 4], [3, 2, 1, 0]]
    preserved = Plan((step("mesh", layout=layout, names=["dp", "tp"], preserve_rank_order=True, out="m"),
                      step("check", mesh="m")))
    sorted_ = Plan((step("mesh", layout=layout, names=["dp", "tp"], out="m"), step("check", mesh="m")))
    seen = observed(preserved, NEWEST, 1, rank=3)
    assert seen["dims"][1]["local_rank"] == seen["coordinate"][1] == 0
    assert seen["dims"][1]["all_gather"] == [3, 2, 1, 0]
    assert "group-rank-order" not in predict(preserved, 8, platform=NEWEST).findings
    assert "group-rank-order" in predict(sorted_, 8, platform=NEWEST).findings


def test_a_sum_predicted_with_the_placements_torch_chose_keeps_the_global_value():
    plan = Plan((step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m"),
                 step("from_local", mesh="m", local_shape=[2, 3], placements=["P(max)", "S(0)"], out="x"),
                 step("sum", tensor="x", dim=0, out="s"),
                 step("full_tensor", tensor="s")))
    chose = {2: ["S(0)", "P(sum)"]}
    assert observed(plan, NEWEST, 2)["placements"] == ["R", "R"]  # the model's own rule
    assert observed(plan, NEWEST, 2, chosen=chose)["placements"] == ["S(0)", "P(sum)"]
    assert observed(plan, NEWEST, 3, chosen=chose) == observed(plan, NEWEST, 3)  # the contract holds either way


def _sum_of_shard_and_avg_partial_on_two_of_eight_ranks():
    return Plan((step("mesh", layout=[[0], [1]], names=["dp", "tp"], out="m"),
                 step("from_local", mesh="m", local_shape=[2], placements=["P(avg)", "P(avg)"], out="x"),
                 step("redistribute", tensor="x", placements=["S(0)", "P(avg)"], out="y"),
                 step("sum", tensor="y", dim=0, out="s")))


def test_a_choice_the_meshs_members_made_is_followed_on_them_and_not_outside_the_mesh():
    plan = _sum_of_shard_and_avg_partial_on_two_of_eight_ranks()
    chose = {3: ["P(sum)", "R"]}  # torch 2.15's members; ranks outside the mesh keep [R, R] (measured)
    assert observed(plan, NEWEST, 3, rank=0)["placements"] == ["R", "R"]
    assert observed(plan, NEWEST, 3, rank=0, chosen=chose)["placements"] == ["P(sum)", "R"]
    assert observed(plan, NEWEST, 3, rank=5, chosen=chose) == observed(plan, NEWEST, 3, rank=5)


def test_torch_chose_reads_one_choice_from_the_ranks_that_departed_and_none_where_they_disagree():
    from types import SimpleNamespace

    from meshsim.model.choices import torch_chose

    plan = _sum_of_shard_and_avg_partial_on_two_of_eight_ranks()
    prediction = predict(plan, 8, platform=NEWEST)

    def record(choices):
        states = []
        for rank in range(8):
            seen = [prediction.expected(rank, i) for i in range(4)]
            seen[3] = dict(seen[3], placements=choices.get(rank, seen[3]["placements"]))
            states.append(SimpleNamespace(rank=rank, observations=seen))
        return SimpleNamespace(states=states)

    members_chose = record({0: ["P(sum)", "R"], 1: ["P(sum)", "R"]})
    assert torch_chose(plan, prediction, members_chose) == {3: ["P(sum)", "R"]}
    members_disagree = record({0: ["P(sum)", "R"], 1: ["S(0)", "R"]})
    assert torch_chose(plan, prediction, members_disagree) == {}


@pytest.mark.parametrize("placements", [["S(0)", "R"], ["R", "S(1)"], ["S(0)", "S(1)"]])
def test_a_sum_of_a_shard_on_an_indexed_device_mesh_fails_on_its_members_from_2_14_only(placements):
    plan = Plan((step("mesh", layout=[[0, 1], [2, 3]], names=["a", "b"], device="cpu:0", out="m"),
                 step("distribute", mesh="m", shape=[4, 4], placements=placements, out="x"),
                 step("sum", tensor="x", dim=0, out="s")))
    for release, fails in (((2, 13, 0), False), ((2, 14, 1), True), ((2, 15, 0), True)):
        on_member = observed(plan, Platform(release=release), 2, rank=1)
        assert isinstance(on_member, Quirk) == fails, release
        assert not isinstance(observed(plan, Platform(release=release), 2, rank=6), Quirk)  # outside the mesh


def test_a_choice_no_legal_strategy_can_make_is_not_followed():
    plan = Plan((step("init_device_mesh", shape=[8], names=["a"], out="m"),
                 step("distribute", mesh="m", shape=[8, 2], placements=["S(0)"], out="x"),
                 step("sum", tensor="x", dim=0, out="s")))
    assert observed(plan, NEWEST, 2, chosen={2: ["P(max)"]})["placements"] == ["P(sum)"]


# --------------------------------------------------------------------------------------------- findings' versions


def test_every_finding_holds_exactly_where_its_scenario_measured_it_and_nowhere_it_was_fixed():
    from meshsim.model.findings import REGISTRY

    measured = {fid: f.measured for fid, f in REGISTRY.items() if f.measured}
    assert measured, "no measurement: python bench/releases.py findings --write"
    for fid, releases in measured.items():
        for release, state in releases.items():
            if state in ("holds", "fixed"):
                assert REGISTRY[fid].applies(release) == (state == "holds"), (fid, release, state)


def test_every_finding_is_measured_by_a_scenario_or_says_why_it_cannot_be():
    from meshsim.model.findings import REGISTRY

    for finding in REGISTRY.values():
        assert finding.measured or finding.unmeasurable, f"{finding.id}: no scenario measures it, and no reason"


def test_a_finding_a_release_lets_a_program_opt_out_of_says_how_in_the_report():
    from rich.console import Console

    from meshsim.judge.report import render_findings
    from meshsim.judge.verdict import FindingHit

    console = Console(record=True, width=300)
    hit = FindingHit("group-rank-order", ["step 1 dims[0].local_rank"], {0, 1})
    render_findings({"group-rank-order": hit}, console)
    assert "fixed in 2.15 with preserve_rank_order=True" in console.export_text()


def test_the_releases_page_lists_every_rule_as_the_model_names_it():
    import os

    from meshsim.model.semantics import rules_markdown

    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "releases.md"), encoding="utf-8").read()
    embedded = page.split("<!-- rules:begin -->\n", 1)[1].split("\n<!-- rules:end -->", 1)[0]
    assert embedded == rules_markdown(), "paste meshsim.model.semantics.rules_markdown() into docs/releases.md"


def test_a_flattened_mesh_flattened_again_is_itself_renamed_from_2_10_and_refused_before():
    plan = Plan((step("init_device_mesh", shape=[2, 2, 2], names=["a", "b", "c"], out="m"),
                 step("flatten", src="m", out="f"),
                 step("flatten", src="f", name="again", out="g")))
    assert observed(plan, OLDEST, 2).matches({"error": ["ValueError", "tuple.index(x): x not in tuple"]})
    assert observed(plan, Platform(release=(2, 10, 0)), 2)["names"] == ["again"]


def test_a_rank_outside_the_mesh_gets_an_empty_shard_whatever_the_shard_dim():
    plan = Plan((step("init_device_mesh", shape=[1], out="m"),
                 step("distribute", mesh="m", shape=[0], placements=["S(1)"], out="t")))
    assert observed(plan, Platform(), 1, rank=3)["local_shape"] == [0]  # outside: no dim is looked at
    assert isinstance(observed(plan, Platform(), 1, rank=0), Err)  # inside: Shard(1) of a 1-D tensor is refused
