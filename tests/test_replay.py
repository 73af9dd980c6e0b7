"""meshsim replay: real Flight Recorder dumps of hung jobs in, culprits and a runnable scenario out.

The dumps under tests/data/flight_recorder are real 8-rank gloo hangs (each case's script.py, dumped by
frcase.py) and two NCCL-shaped ones crafted from torch's format (craft_nccl.py); see its README.
"""

from __future__ import annotations

import argparse
import functools
import os
import pickle
import random
import shutil
import sys
import time
import tomllib

import pytest

from meshsim.replay.analyze import DEAD, MISMATCH, SKIPPED, STALLED, analyze, to_record
from meshsim.replay.dumps import ReplayError, read_dir
from meshsim.replay.incident import FAILED, build
from meshsim.replay.to_scenario import to_scenario

DATA = os.path.join(os.path.dirname(__file__), "data", "flight_recorder")
sys.path.insert(0, DATA)

# case -> (culprits, kind): what each script did on purpose
CASES = {
    "skip_on_mesh_dim": ([5], SKIPPED),
    "skip_in_loop": ([1], SKIPPED),
    "straggler": ([3], STALLED),
    "wrong_collective_on_new_group": ([2], MISMATCH),
    "rank_exited_early": ([6], DEAD),
    "long_loop_small_buffer": ([6], SKIPPED),
    "unnamed_3d_mesh": ([7], SKIPPED),
    "nccl_skip_on_mesh_dim": ([5], SKIPPED),
    "nccl_size_mismatch_timeout": ([6], MISMATCH),
}


def dumps_of(case: str) -> str:
    return os.path.join(DATA, case, "dumps")


@functools.cache
def dumpset(case: str):
    return read_dir(dumps_of(case))


def incident(case: str):
    return build(dumpset(case))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_recorded_hang_names_the_rank_its_script_made_diverge(case):
    culprits, kind = CASES[case]
    analysis = analyze(incident(case))
    assert analysis.culprits == culprits, analysis.summary
    assert analysis.kind == kind, analysis.summary


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_culprit_does_not_depend_on_the_order_dump_files_are_listed(case):
    listed = dumpset(case)
    first = analyze(build(listed))
    for seed in range(4):
        shuffled = list(listed.dumps)
        random.Random(seed).shuffle(shuffled)
        again = analyze(build(type(listed)(listed.directory, listed.prefix, shuffled, listed.version)))
        assert (again.culprits, again.kind, again.summary) == (first.culprits, first.kind, first.summary)


def test_torchs_analyzer_answer_depends_on_the_file_order_where_meshsims_does_not():
    from meshsim.replay.torch_analyzer import run_torch

    answer = run_torch(dumpset("wrong_collective_on_new_group"), incident("wrong_collective_on_new_group"))
    assert answer.culprits == [2]  # listed in rank order, it names the rank that broadcast
    assert answer.by_order["rank 2 first"][0] == (0, 1, 3)  # rank 2's file first: it blames the other three
    assert answer.order_dependent


def test_gloo_dumps_name_no_group_members_and_torchs_analyzer_fails_on_them_as_they_are():
    from meshsim.replay.torch_analyzer import run_torch

    with open(os.path.join(dumps_of("skip_on_mesh_dim"), "fr_trace_rank_0"), "rb") as f:
        raw = pickle.load(f)
    assert raw["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[]"}}
    assert {e["state"] for e in raw["entries"]} == {"scheduled"}  # only `retired` tells what finished
    answer = run_torch(dumpset("skip_on_mesh_dim"), incident("skip_on_mesh_dim"))
    assert answer.as_dumped.startswith("KeyError")
    assert answer.culprits == [] and 5 in answer.missing  # with the groups filled in: missing ranks, no culprit


def test_a_devicemesh_is_rebuilt_from_the_names_gloo_gives_its_groups():
    inc = incident("skip_on_mesh_dim")
    (mesh,) = inc.meshes
    assert (mesh.shape, mesh.names) == ((2, 4), ("dp", "tp"))
    tp = {g.ranks for g in inc.groups.values() if g.dim == "tp"}
    dp = {g.ranks for g in inc.groups.values() if g.dim == "dp"}
    assert tp == {(0, 1, 2, 3), (4, 5, 6, 7)} and dp == {(0, 4), (1, 5), (2, 6), (3, 7)}


def test_a_mesh_dim_no_rank_called_on_still_shapes_the_mesh():
    (mesh,) = incident("skip_in_loop").meshes  # only dp was used: tp left nothing but the names it took
    assert (mesh.shape, mesh.names) == ((2, 4), ("dp", "unseen"))
    (unnamed,) = incident("unnamed_3d_mesh").meshes  # dim 0 unused, and torch named the dims by index
    assert (unnamed.shape, unnamed.names, unnamed.named) == ((2, 2, 2), ("dim_0", "dim_1", "dim_2"), False)
    replay = to_scenario(incident("unnamed_3d_mesh"), analyze(incident("unnamed_3d_mesh")))
    mesh_step = next(s for s in replay.data["step"] if s.get("out") == "m")
    assert "names" not in mesh_step and replay.data["expect"]["mesh_dim"] == 1


def test_a_rank_without_a_dump_is_never_counted_as_arrived():
    inc = incident("rank_exited_early")
    assert inc.missing == [6]
    assert {g.ranks for g in inc.groups_of(6)} >= {(2, 6), (4, 5, 6, 7)}  # from the mesh, not from its dump
    analysis = analyze(inc)
    assert any(6 in w.missing for w in analysis.waits)
    # gloo retired the calls that raised when rank 6 left: they did not complete
    assert inc.ranks[5].held.state == FAILED and inc.ranks[2].held.state == FAILED
    record = to_record(inc, analysis)
    assert record.died == [6]


def test_partners_of_a_rank_that_skipped_completed_mismatched_calls_and_are_called_victims():
    analysis = analyze(incident("skip_in_loop"))
    # gloo records reduce_scatter_tensor as all_reduce: only the call sites show the pairs were mismatched
    assert len(analysis.mismatches) == 3
    assert "paired with a different call of rank [1]" in analysis.victims[5]


def test_per_group_counts_survive_ring_buffers_that_dropped_calls():
    inc = incident("long_loop_small_buffer")
    tp = next(g.key for g in inc.groups.values() if g.dim == "tp" and 6 in g.ranks)
    assert all(inc.ranks[r].wrapped for r in range(8))
    assert inc.ranks[6].issued(tp) == 9 and inc.ranks[4].issued(tp) == 10


def test_nccl_calls_queued_behind_a_stuck_one_are_not_arrivals():
    analysis = analyze(incident("nccl_skip_on_mesh_dim"))
    waits = {w.rank: w for w in analysis.waits}
    assert waits[0].missing == [4]  # rank 4 enqueued its dp all_reduce, behind its stuck tp one


def test_nccl_coalesced_entries_are_one_call_and_point_to_point_is_left_out():
    inc = incident("nccl_size_mismatch_timeout")
    coalesced = [c for c in inc.ranks[4].calls if c.ops]
    assert [c.ops for c in coalesced] == [("_reduce_scatter_base", "_reduce_scatter_base")]
    replay = to_scenario(inc, analyze(inc))
    assert any("point-to-point" in text for text in replay.left_out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_scenario_is_toml_meshsim_reads_and_expects_the_culprits_of_the_dumps(case, tmp_path):
    from meshsim.scenario import load

    inc = incident(case)
    analysis = analyze(inc)
    replay = to_scenario(inc, analysis, deadline=5)
    path = replay.save(str(tmp_path / "replay.toml"))
    with open(path) as f:
        assert tomllib.loads(f.read()) == replay.data
    scenario = load(path)
    assert list(scenario.expect.culprit_ranks) == analysis.culprits
    assert scenario.expect.outcome == ("crash" if case == "rank_exited_early" else "hang")


@pytest.mark.parametrize("case", sorted(set(CASES) - {"nccl_size_mismatch_timeout"}))
def test_meshsims_judge_names_the_same_culprits_from_the_record_and_plan_of_an_incident(case):
    # not nccl_size_mismatch_timeout: a RunRecord carries no tensor sizes, and the judge takes size
    # mismatches from the model's prediction, which an incident has none of
    from meshsim.judge.diagnose import diagnose

    inc = incident(case)
    analysis = analyze(inc)
    plan = to_scenario(inc, analysis).scenario().plan
    assert diagnose(to_record(inc, analysis), plan).culprits == analysis.culprits


def test_a_64_rank_incident_is_diagnosed_and_written_as_a_scenario_in_under_a_second(tmp_path):
    import synth

    synth.write(str(tmp_path), shape=(8, 8), names=("dp", "tp"), steps=3, skip=(13, 1, "tp"))
    read = read_dir(str(tmp_path))
    began = time.monotonic()
    inc = build(read)
    analysis = analyze(inc)
    replay = to_scenario(inc, analysis)
    replay.scenario()
    assert time.monotonic() - began < 1.0
    assert analysis.culprits == [13] and inc.meshes[0].shape == (8, 8)
    assert replay.data["topology"] == {"hosts": 8, "devices_per_host": 8}


def _copy(case: str, tmp_path) -> str:
    out = tmp_path / "dumps"
    shutil.copytree(dumps_of(case), out)
    return str(out)


def _rewrite(path: str, change) -> None:
    with open(path, "rb") as f:
        data = pickle.load(f)
    change(data)
    with open(path, "wb") as f:
        pickle.dump(data, f)


class _Trap:
    """Unpickled by plain pickle, it would run a shell command."""

    def __init__(self, directory: str):
        self.directory = directory

    def __reduce__(self):
        return (os.system, (f"touch {self.directory}/it-ran",))


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _truncate(path: str) -> None:
    with open(path, "rb") as f:
        _write(path, f.read()[:400])


BAD = {
    "truncated": lambda d: _truncate(f"{d}/fr_trace_rank_3"),
    "not a pickle": lambda d: _write(f"{d}/fr_trace_rank_3", b"just text\n"),
    "unknown version": lambda d: _rewrite(f"{d}/fr_trace_rank_3", lambda x: x.update(version="3.0")),
    "mixed jobs": lambda d: _rewrite(f"{d}/fr_trace_rank_3", lambda x: x.update(version="2.9")),
    "duplicate rank": lambda d: shutil.copy(f"{d}/fr_trace_rank_3", f"{d}/fr_trace_rank_03"),
    "two prefixes": lambda d: shutil.copy(f"{d}/fr_trace_rank_3", f"{d}/other_rank_3"),
    "not a record": lambda d: _rewrite(f"{d}/fr_trace_rank_3", lambda x: x["entries"][0].pop("collective_seq_id")),
    "names a global": lambda d: _write(f"{d}/fr_trace_rank_3", pickle.dumps({"version": "2.10", "entries": _Trap(d)})),
}


@pytest.mark.parametrize("damage", sorted(BAD))
def test_bad_dumps_fail_in_one_line_naming_the_file(damage, tmp_path):
    directory = _copy("skip_on_mesh_dim", tmp_path)
    BAD[damage](directory)
    with pytest.raises(ReplayError) as raised:
        build(read_dir(directory))
    message = str(raised.value)
    named = {"duplicate rank": "fr_trace_rank_03", "two prefixes": "other_rank_3"}.get(damage, "fr_trace_rank_3")
    assert "\n" not in message and f"{named}:" in message, message
    assert not os.path.exists(f"{directory}/it-ran")  # a dump is read by an unpickler that runs nothing


def test_the_command_exits_2_with_one_line_and_no_traceback_for_bad_dumps(tmp_path, capsys):
    from meshsim.replay.cli import add_arguments, main

    directory = _copy("skip_on_mesh_dim", tmp_path)
    BAD["truncated"](directory)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args([directory, "--tier", "none", "--scenario-out", str(tmp_path / "x.toml")])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "fr_trace_rank_3" in err


def test_a_world_beyond_the_tier_asked_for_is_refused_in_one_line_after_the_scenario_is_written(tmp_path, capsys):
    import synth

    from meshsim.replay.cli import add_arguments, main

    synth.write(str(tmp_path / "dumps"), shape=(9, 8), names=("dp", "tp"), steps=1, skip=(3, 0, "dp"))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "big.toml"
    assert main(parser.parse_args([str(tmp_path / "dumps"), "--tier", "process", "--scenario-out", str(out)])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "72 ranks" in err and out.exists()


def test_the_command_writes_the_scenario_and_reports_both_analyzers(tmp_path, capsys):
    import json

    from meshsim.replay.cli import add_arguments, main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "s.toml"
    args = parser.parse_args([dumps_of("straggler"), "--tier", "none", "--scenario-out", str(out), "--json"])
    assert main(args) == 1  # as `meshsim run`: the dumps show a hang
    report = json.loads(capsys.readouterr().out)
    assert report["diagnosis"]["culprit_ranks"] == [3] and out.exists()
    assert report["torch_analyzer"]["culprits"] == [] and report["agreement"].startswith("differ")


def test_the_replay_hangs_where_the_job_hung_and_the_fix_makes_it_finish(meshsim_cluster):
    from meshsim.scenario import judge_scenario, parse

    inc = incident("skip_on_mesh_dim")
    replay = to_scenario(inc, analyze(inc), deadline=3)
    scenario = replay.scenario()
    assert scenario.topology.world == meshsim_cluster.world
    result = meshsim_cluster.run(scenario.plan, deadline=scenario.deadline)
    assert judge_scenario(scenario, result).matched, result.diagnosis and result.diagnosis.summary
    fixed = dict(replay.data, step=[{k: v for k, v in s.items() if k != "skip_on"} for s in replay.data["step"]])
    fixed["expect"] = {"outcome": "pass"}
    again = parse(fixed)
    assert meshsim_cluster.run(again.plan, deadline=again.deadline).outcome == "pass"
