"""Scenario files keep their meaning: a file names its format, a file without one is read as meshsim 0.2 meant it
(and its report says how to update it), `meshsim run --upgrade` rewrites it in the current format, and the files
meshsim 0.3 saved (counterexamples, replays) end as they did.

tests/data/scenarios-0.2: files written for 0.2. The repository's own, from its history (05 and 14 as they were in
0.2, eb36c01; 15 and 20 before their steps were marked, 80b6196^), a counterexample 0.2's `meshsim fuzz` saved
(a seeded bug: DeviceMesh.__getitem__ raising ValueError for KeyError), and probes and hangs written as a 0.2
user wrote them, each [expect] what 0.2 reported. tests/data/scenarios-0.3: a counterexample 0.3's fuzz saved
(seeded: get_local_rank's errors retyped) and a replay 0.3 wrote (`meshsim replay ... --tier none`)."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil

import pytest

from meshsim import cli
from meshsim.check import prediction_for
from meshsim.ops import operation_of
from meshsim.scenario import formats
from meshsim.scenario.files import judge_scenario, load, parse, raising_steps
from meshsim.scenario.upgrade import needs_run, upgrade

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLD = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "scenarios-0.2", "*.toml")))
SAVED_BY_03 = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "scenarios-0.3", "*.toml")))
MINE = sorted(glob.glob(os.path.join(ROOT, "scenarios", "*.toml")) + glob.glob(os.path.join(ROOT, "scenarios",
                                                                                           "torch", "*.toml")))
HINT = "`meshsim run --upgrade"


def _name(path: str) -> str:
    return os.path.basename(path)[:-5]


def _unmarked_raising(scenario) -> list[int]:
    prediction = prediction_for(scenario.plan, scenario.topology.world, scenario.deadline)
    return [i for i in raising_steps(scenario.plan, prediction, scenario.topology.world)
            if not scenario.plan.steps[i].expect_error and operation_of(scenario.plan.steps[i]).role != "fault"]


def test_a_file_names_its_format_and_one_without_is_read_by_0_2s_rules():
    table = {"topology": {"hosts": 1, "devices_per_host": 2},
             "step": [{"op": "init_device_mesh", "shape": [2], "out": "m"}]}
    assert parse(table).format == formats.LEGACY == 1
    assert parse({"format": 2, **table}).format == formats.CURRENT == 2
    assert parse({"format": 1, **table}).format == 1


@pytest.mark.parametrize("value, message", [(3, "format 3 is newer than this meshsim reads"), ("2", "format must be"),
                                            (0, "format 0 is not a scenario format"), (True, "format must be")])
def test_a_format_this_meshsim_does_not_read_is_a_one_line_error_and_exit_2(tmp_path, capsys, value, message):
    path = tmp_path / "future.toml"
    body = '[topology]\nhosts = 1\ndevices_per_host = 2\n[[step]]\nop = "init_device_mesh"\nshape = [2]\n'
    path.write_text(f"format = {json.dumps(value)}\n{body}")
    for command in (["run", str(path)], ["run", "--upgrade", str(path)]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(path) in err[0] and message in err[0], err
    assert path.read_text().startswith(f"format = {json.dumps(value)}\n")  # nothing written


@pytest.mark.parametrize("path", OLD, ids=[_name(p) for p in OLD])
def test_a_file_written_for_0_2_runs_as_it_did_and_says_how_to_update_it(meshsim_pool, path):
    scenario = load(path)
    assert scenario.format == formats.LEGACY
    result = meshsim_pool.get(str(scenario.topology)).run(scenario.plan, deadline=scenario.deadline)
    run = judge_scenario(scenario, result)
    assert run.matched, run.problems
    (note,) = run.notes
    assert f"{HINT} {path}` rewrites it in format 2" in note
    # the same file read by today's rules fails exactly where a step raises that it does not mark
    today = judge_scenario(dataclasses.replace(scenario, format=formats.CURRENT), result)
    unmarked = _unmarked_raising(scenario)
    assert [p for p in today.problems if "misspelt" in p] == [p for p in today.problems if "expect_error" in p]
    assert len([p for p in today.problems if "misspelt" in p]) == len(unmarked)


def test_the_0_2_files_include_steps_that_raise_unmarked_kinds_0_3_renamed_and_deadlines_under_a_second():
    scenarios = [load(p) for p in OLD]
    assert sum(bool(_unmarked_raising(sc)) for sc in scenarios) >= 6
    assert {sc.expect.kind for sc in scenarios} >= {"reordered collectives", "inconsistent mesh across ranks"}
    assert [sc.deadline for sc in scenarios if sc.name.endswith("short-deadline")] == [1.0, 1.0]


def test_a_0_2_deadline_under_a_second_is_one_second_with_every_sleep_stretched_alike():
    past = load(os.path.join(ROOT, "tests", "data", "scenarios-0.2", "straggler-short-deadline.toml"))
    within = load(os.path.join(ROOT, "tests", "data", "scenarios-0.2", "within-short-deadline.toml"))
    assert (past.deadline, past.plan.steps[1].args["seconds"]) == (1.0, 1.6)  # 0.8 s past 0.5 s
    assert (within.deadline, within.plan.steps[1].args["seconds"]) == (1.0, 0.25)  # 0.2 s within 0.8 s
    assert load(os.path.join(ROOT, "tests", "data", "scenarios-0.2", "straggler-short-deadline.toml"),
                deadline=2.0).plan.steps[1].args["seconds"] == 0.8  # --deadline is the option's, not the file's


@pytest.mark.parametrize("path", [p for p in OLD if not needs_run(load(p))],
                         ids=[_name(p) for p in OLD if not needs_run(load(p))])
def test_upgrade_marks_what_the_model_says_raises_keeps_the_files_text_and_ends_alike(tmp_path, capsys, path):
    copy = tmp_path / os.path.basename(path)
    shutil.copy(path, copy)
    before = open(path).read()
    assert upgrade(copy, run=None).changed  # no runner: the model alone answers, no cluster starts
    after = copy.read_text()
    assert after.startswith("format = 2\n") or "\nformat = 2\n" in after.split("[", 1)[0]
    kept = iter(after.splitlines())
    assert all(line in kept for line in before.splitlines() if not line.startswith(("deadline", "seconds")))
    upgraded = load(copy)
    assert upgraded.format == 2 and _unmarked_raising(upgraded) == []
    assert {i for i, st in enumerate(upgraded.plan.steps) if st.expect_error} == \
        {i for i, st in enumerate(load(path).plan.steps) if st.expect_error} | set(_unmarked_raising(load(path)))
    # and it ends as the original did (on the model tier: the judgement is the same whatever ran)
    assert cli.main(["run", str(copy), "--tier", "model"]) == cli.main(["run", path, "--tier", "model"])
    assert HINT not in " ".join(capsys.readouterr().out.split()).replace(f"{HINT} {path}", "")


def test_upgrade_runs_a_hang_once_to_learn_todays_name_for_its_kind(tmp_path, capsys):
    copy = tmp_path / "05.toml"
    shutil.copy(os.path.join(ROOT, "tests", "data", "scenarios-0.2", "05-subgroups-in-opposite-order.toml"), copy)
    assert cli.main(["run", "--upgrade", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "upgraded (ran once to learn its kind of hang)" in out
    assert "[expect] kind 'reordered collectives' -> 'skipped collective'" in out
    assert 'kind = "skipped collective"' in copy.read_text() and "Rank 0 waits in tp" in copy.read_text()
    assert cli.main(["run", "--upgrade", str(copy)]) == 0  # already current: left as it is
    assert "already in format 2; unchanged" in capsys.readouterr().out


def test_upgrade_validates_every_file_first_and_writes_none_when_one_is_bad(tmp_path, capsys):
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    shutil.copy(os.path.join(ROOT, "tests", "data", "scenarios-0.2", "probe-misspelt-dim.toml"), good)
    bad.write_text('[topology]\nhosts = 1\ndevices_per_host = 2\n[[step]]\nop = "teleport"\n')
    text = good.read_text()
    assert cli.main(["run", "--upgrade", str(good), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.toml" in err[0] and "teleport" in err[0]
    assert good.read_text() == text


def test_upgrade_rewrites_a_file_whole_where_it_cannot_keep_its_layout(tmp_path, capsys):
    path = tmp_path / "inline.toml"
    path.write_text('# steps as an inline array\nname = "inline"\n'
                    'step = [{op = "init_device_mesh", shape = [2], names = ["tp"], out = "m"},\n'
                    '        {op = "query", mesh = "m", what = "get_group", dim = "pp"}]\n'
                    '[topology]\nhosts = 1\ndevices_per_host = 2\n')
    assert cli.main(["run", "--upgrade", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "step 1 (query): expect_error = true" in out and "rewritten from its table" in out
    scenario = load(path)
    assert scenario.format == 2 and scenario.plan.steps[1].expect_error


def test_upgrade_keeps_comments_multi_line_layouts_and_a_description_that_quotes_a_step(tmp_path):
    path = tmp_path / "layout.toml"
    path.write_text('''# a probe
name = "layout"
description = """
Quotes a header:
[[step]]
op = "nothing"
"""

[topology]
hosts = 1
devices_per_host = 4

[[step]]  # the mesh
op = "mesh"
layout = [
  [0, 1],
  [2, 3]
]
names = ["a", "b"]
out = "m"

[[step]]
op = "query"
mesh = "m"
what = "get_local_rank"
dim = "c"   # misspelt on purpose

[step.on_rank.0]
dim = "a"
''')
    before = path.read_text()
    done = upgrade(path)
    assert not done.whole and done.changes[1].startswith("step 1 (query): expect_error = true")
    after = path.read_text()
    assert after == before.replace('# a probe\n', '# a probe\nformat = 2\n').replace(
        'dim = "c"   # misspelt on purpose\n', 'dim = "c"   # misspelt on purpose\nexpect_error = true\n')


@pytest.mark.parametrize("path", SAVED_BY_03, ids=[_name(p) for p in SAVED_BY_03])
def test_a_file_meshsim_0_3_saved_ends_as_it_did_by_either_formats_rules(meshsim_pool, path):
    scenario = load(path)
    assert scenario.format == formats.LEGACY  # 0.3 wrote no format
    result = meshsim_pool.get(str(scenario.topology)).run(scenario.plan, deadline=scenario.deadline)
    as_02 = judge_scenario(scenario, result)
    as_03 = judge_scenario(dataclasses.replace(scenario, format=formats.CURRENT), result)
    assert as_02.matched and as_02.problems == as_03.problems


def test_no_replay_has_a_step_that_raises_so_every_replay_reads_alike_in_both_formats():
    from meshsim.replay import analyze, build, read_dir, to_scenario

    cases = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "flight_recorder", "*", "dumps")))
    assert len(cases) >= 20
    for dumps in cases:
        incident = build(read_dir(dumps))
        replay = to_scenario(incident, analyze(incident))
        assert replay.toml().startswith("format = 2\n")  # every file meshsim writes names the current format
        scenario = replay.scenario()
        assert scenario.format == 2 and _unmarked_raising(scenario) == [], dumps


def test_the_repositorys_own_scenarios_name_the_current_format():
    assert MINE and [p for p in MINE if load(p).format != formats.CURRENT] == []


def test_a_saved_scenario_names_the_current_format_first(tmp_path):
    scenario = load(os.path.join(ROOT, "tests", "data", "scenarios-0.2", "probe-misspelt-dim.toml"))
    saved = scenario.save(tmp_path / "saved.toml")
    assert saved.read_text().startswith("format = 2\n") and load(saved).format == 2


def test_run_prints_the_update_hint_once_for_an_old_file_and_json_carries_it(capsys):
    old = os.path.join(ROOT, "tests", "data", "scenarios-0.2", "probe-misspelt-dim.toml")
    assert cli.main(["run", old, "--tier", "model"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.count(HINT) == 1 and "written in format 1 (meshsim 0.2's rules, no `format` key)" in out
    assert cli.main(["run", old, "--tier", "model", "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["format"] == 1 and report["matched"] and HINT in report["notes"][0]
    current = os.path.join(ROOT, "scenarios", "01-recipe-2d-mesh.toml")
    assert cli.main(["run", current, "--tier", "model", "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["format"] == 2 and report["notes"] == []


def test_in_a_0_2_file_a_step_that_raises_still_explains_a_run_that_fails_for_another_reason(tmp_path, capsys):
    path = tmp_path / "typo.toml"  # a misspelt dim: no rank reaches the skipped collective, so nothing hangs
    path.write_text('[topology]\nhosts = 1\ndevices_per_host = 2\n'
                    '[[step]]\nop = "init_device_mesh"\nshape = [2]\nnames = ["tp"]\nout = "m"\n'
                    '[[step]]\nop = "all_reduce"\nmesh = "m"\ndim = "tpp"\nskip_on = [1]\n'
                    '[expect]\noutcome = "hang"\n')
    assert cli.main(["run", str(path), "--tier", "model"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "outcome pass, expected hang" in out and "step 1 (all_reduce) raises" in out and "misspelt" in out


def test_upgrade_rewrites_a_format_the_file_names_in_place(tmp_path):
    path = tmp_path / "one.toml"
    original = open(os.path.join(ROOT, "tests", "data", "scenarios-0.2", "probe-slice-unknown-name.toml")).read()
    path.write_text("format = 1  # 0.2's rules, said out loud\n" + original)
    assert load(path).format == 1
    done = upgrade(path)
    assert not done.whole and path.read_text().startswith("format = 2\n" + original.split("\n", 1)[0])
    assert load(path).format == 2
