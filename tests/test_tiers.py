"""The thread, fake and model tiers: the same plans, the same model, one verdict each."""


import copy

import pytest
from helpers import alive

from meshsim import Cluster, Topology, step
from meshsim.check import check
from meshsim.cli import main
from meshsim.core.wire import UNMOVED, is_digest
from meshsim.model.predict import predict
from meshsim.run.fake import sample_ranks
from meshsim.run.tiers import TierError, open_executor
from meshsim.spec.plan import Plan

COMPOSED = Plan((
    step("init_device_mesh", out="m", shape=[2, 2, 2], names=["dp", "cp", "tp"]),
    step("slice", src="m", names=["dp", "tp"], out="s"),
    step("flatten", src="s", name="dp_tp", out="f"),
    step("check", mesh="s"),
    step("check", mesh="f"),
    step("all_gather", mesh="m", dim="cp"),
))


@pytest.mark.parametrize("tier", ["thread", "fake", "model"])
def test_every_tier_agrees_with_the_model_on_a_composed_plan(tier, meshsim_cluster):
    reference = meshsim_cluster.run(COMPOSED)
    with Cluster(Topology(2, 4), tier=tier) as executor:
        result = executor.run(COMPOSED)
    assert result.passed and reference.passed
    assert set(result.findings) == set(reference.findings)


def test_fake_tier_reports_collectives_as_unchecked_not_as_values():
    with Cluster(Topology(2, 4), tier="fake") as executor:
        result = executor.run(COMPOSED)
    observed = result.record.states[3].observations
    assert observed[5] == UNMOVED
    assert all(dim["all_reduce"] == UNMOVED for dim in observed[3]["dims"])
    assert any("moves no data" in note for note in result.notes)


@pytest.mark.parametrize("tier", ["fake", "thread"])
def test_ranks_played_by_one_process_each_plan_their_own_uneven_shard_to_shard_move(tier):
    """torch caches a redistribute's transforms by spec alone, and each holds its rank's logical shape: played one
    after another in one process, coordinate 1 of this uneven move got coordinate 0's row."""
    plan = Plan((step("init_device_mesh", shape=[2, 1, 4], names=["a", "b", "c"], out="m"),
                 step("distribute", mesh="m", shape=[1, 1], placements=["S(0)", "R", "R"], out="t"),
                 step("redistribute", tensor="t", placements=["S(0)", "R", "S(0)"], out="u"),
                 step("redistribute", tensor="u", placements=["S(0)", "R", "S(1)"], out="v"),
                 step("to_local", tensor="v")))
    with Cluster(Topology(2, 4), tier=tier, deadline=30) as cluster:
        verdict = check(cluster, plan)
    assert verdict.outcome == "pass", verdict.differences
    assert [verdict.record.states[r].observations[4]["shape"] for r in (0, 4, 5)] == [[1, 1], [0, 1], [0, 0]]


def test_fake_tier_finds_a_wrong_layout_through_digests_of_large_meshes():
    # 512 ranks: mesh views travel as digests; a prediction for another layout must disagree on every rank.
    plan = Plan((step("init_device_mesh", out="m", shape=[8, 8, 8], names=["a", "b", "c"]), step("check", mesh="m")))
    other = Plan((step("init_device_mesh", out="m", shape=[8, 64], names=["a", "b"]), step("check", mesh="m")))
    with Cluster(Topology(64, 8), tier="fake", ranks=40) as executor:
        good = executor.run(plan)
        bad = check(executor, plan, 30, prediction=predict(other, 512, 30))
    assert good.passed, good.differences[:2]
    assert is_digest(good.record.states[0].observations[0]["mesh"])
    assert not bad.passed
    assert set(bad.differences[0].ranks) == set(good.record.checked)


def test_fake_tier_sample_holds_every_hosts_first_and_last_rank():
    ranks = sample_ranks(Topology(16, 8), 40, seed=3)
    assert len(ranks) == 40
    assert {h * 8 for h in range(16)} | {h * 8 + 7 for h in range(16)} <= set(ranks)
    assert sample_ranks(Topology(2, 4), None) == list(range(8))


def test_thread_tier_diagnoses_a_skipped_collective_by_rank_group_and_dim():
    plan = Plan((step("init_device_mesh", out="m", shape=[4, 4, 4], names=["a", "b", "c"]),
                 step("all_reduce", mesh="m", dim="b", skip_on=[5])))
    with Cluster(Topology(8, 8), tier="thread") as executor:
        hung = executor.run(plan, deadline=3)
        after = executor.run(COMPOSED)  # a fresh host serves the next plan
    assert hung.outcome == "hang" and hung.passed
    assert hung.culprits == [5]
    assert "dim 'b'" in hung.diagnosis.summary
    assert hung.record.stacks  # per-thread Python stacks
    assert after.passed


def test_thread_tier_keeps_a_finished_plans_progress_on_the_host_until_a_run_goes_wrong():
    # every rank finished: the results come alone (the judge reads observations); a hang: the ranks that finished
    # are asked what they did too, as the diagnosis reads every rank's calls
    two_d = step("init_device_mesh", out="m", shape=[2, 4], names=["dp", "tp"])
    with Cluster(Topology(2, 4), tier="thread") as executor:
        passed = executor.run(Plan((two_d, step("check", mesh="m"))))
        hung = executor.run(Plan((two_d, step("all_reduce", mesh="m", dim="tp", skip_on=[5]))), deadline=3)
    assert passed.outcome == "pass" and all(not s.created and s.step is None for s in passed.record.states)
    assert hung.outcome == "hang" and hung.culprits == [5]
    finished = [s for s in hung.record.states if s.end == "finished"]
    assert [s.rank for s in finished] == [0, 1, 2, 3, 5]
    assert all(len(s.created) == 6 for s in finished)  # the mesh's four dp groups and two tp groups, on every rank
    assert [s.step for s in finished] == [1, 1, 1, 1, 0]  # rank 5 skipped the all_reduce
    assert [len(s.issued) for s in finished] == [1, 1, 1, 1, 0]


def test_thread_tier_ends_a_rank_that_exits_as_a_crash_and_leaves_nothing_behind():
    plan = Plan((step("init_device_mesh", out="m", shape=[2, 4], names=["a", "b"]),
                 step("exit", code=7, only_on=[3]), step("check", mesh="m")))
    with Cluster(Topology(2, 4), tier="thread") as executor:
        result = executor.run(plan)
        host = executor.pids[0]
    assert result.outcome == "crash" and result.passed
    assert result.record.states[3].exitcode == 7
    assert not alive(host)


def test_model_tier_names_the_culprit_of_a_hang_at_4096_ranks():
    plan = Plan((step("init_device_mesh", out="m", shape=[8, 8, 8, 8], names=["pp", "dp", "cp", "tp"]),
                 step("all_reduce", mesh="m", dim="cp", skip_on=[1234])))
    with Cluster(Topology(512, 8), tier="model") as executor:
        result = executor.run(plan)
    assert result.outcome == "hang" and result.culprits == [1234]


def test_tier_options_are_checked_before_anything_starts(capsys):
    with pytest.raises(TierError):
        open_executor(Topology(2, 4), "thread", ranks=4)
    with pytest.raises(TierError):
        open_executor(Topology(2, 4), "cluster")
    assert main(["fuzz", "--tier", "model", "--ranks", "3", "--examples", "1"]) == 2
    assert "fake tier only" in capsys.readouterr().err


def test_fuzz_runs_on_the_thread_tier_from_the_command_line(capsys, tmp_path):
    assert main(["fuzz", "--tier", "thread", "--hosts", "4", "--devices-per-host", "4", "--examples", "5",
                 "--seed", "2", "--save", str(tmp_path)]) == 0
    assert "thread tier" in capsys.readouterr().out


def test_thread_tier_runs_dtensor_partial_max_and_min_to_shard_like_the_process_tier():
    # torch's threaded group reduce-scatters only by sum and avg; the tier teaches it max and min
    plan = Plan((step("init_device_mesh", shape=[4, 2], out="m"),
                 step("from_local", mesh="m", local_shape=[5], placements=["R", "P(max)"], out="x"),
                 step("redistribute", tensor="x", placements=["R", "S(0)"], out="y"),
                 step("to_local", tensor="y"),
                 step("from_local", mesh="m", local_shape=[3], placements=["P(min)", "R"], out="p"),
                 step("redistribute", tensor="p", placements=["S(0)", "R"], out="q"),
                 step("full_tensor", tensor="q")))
    with Cluster(Topology(2, 4), tier="thread") as executor:
        result = executor.run(plan)
    assert result.passed, result.differences


DTENSOR_AT_SCALE = Plan((
    step("init_device_mesh", shape=[16, 16, 8, 8], names=["pp", "dp", "cp", "tp"], out="m"),
    step("distribute", mesh="m", shape=[37, 5], placements=["S(0)", "R", "S(1)", "R"], out="t"),
    step("redistribute", tensor="t", placements=["R", "S(0)", "R", "R"], out="u"),
    step("to_local", tensor="u"),
    step("full_tensor", tensor="u"),
))


@pytest.fixture(scope="module")
def dtensor_at_16384_ranks():
    with Cluster(Topology(2048, 8), tier="fake", ranks=4) as cluster:
        return cluster.run(DTENSOR_AT_SCALE)


def test_fake_tier_agrees_with_the_model_on_dtensor_shapes_offsets_and_collectives_at_16384_ranks(
        dtensor_at_16384_ranks):
    result = dtensor_at_16384_ranks
    assert result.passed, result.report()
    checked = [state for state in result.record.states if state.observations]
    assert len(checked) == 4
    for state in checked:  # torch's CommDebugMode counts, as the model predicted them
        assert state.observations[1]["comms"] == {"broadcast_": 2, "scatter_": 2}
        assert state.observations[2]["comms"] == {"all_gather_into_tensor": 2}


@pytest.mark.parametrize("field, wrong", [("comms", {"all_gather_into_tensor": 3}), ("local_shape", [2, 5]),
                                          ("offset", [3, 0])])
def test_fake_tier_fails_a_dtensor_step_whose_collectives_shape_or_offset_differ_from_the_model(
        dtensor_at_16384_ranks, field, wrong):
    from meshsim.judge.verdict import judge

    result = dtensor_at_16384_ranks
    record = copy.deepcopy(result.record)
    state = next(s for s in record.states if s.observations)
    state.observations[2] = dict(state.observations[2], **{field: wrong})
    verdict = judge(record, plan=DTENSOR_AT_SCALE, prediction=result.prediction)
    assert not verdict.passed
    assert {d.step for d in verdict.differences} == {2}, verdict.report()
