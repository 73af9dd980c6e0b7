"""The command line: findings, explain (the model alone), and clean errors."""

import json
import os

import pytest

from meshsim import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_findings_lists_the_registry_with_versions(capsys):
    assert cli.main(["findings", "--json"]) == 0
    findings = {f["id"]: f for f in json.loads(capsys.readouterr().out)}
    assert {"slice-order-docstring", "group-rank-order", "repeated-rank-accepted", "group-name-collision",
            "gloo-size-mismatch-silent", "localtensormode-not-an-oracle"} <= set(findings)
    assert findings["flatten-outside-the-mesh-fails"]["until"] == "2.10.0"
    assert all(f["measured"].get("2.13.0") == "holds" or "2.13.0" in f["verified_on"]
               for f in findings.values() if f["applies"])


def test_explain_prints_the_models_prediction_without_torch(capsys):
    path = os.path.join(ROOT, "scenarios", "04-skipped-subgroup-all-reduce.toml")
    assert cli.main(["explain", path, "--rank", "5", "--rank", "4"]) == 0
    out = capsys.readouterr().out
    assert "model predicts hang" in out and "culprit ranks [5]" in out
    assert "rank 4 (waits forever in all_reduce on group [4, 5, 6, 7] at step 2, missing [5])" in out
    assert "rank 5 (waits forever in all_gather on group [4, 5, 6, 7] at step 2, missing [4, 6, 7])" in out
    assert "(finished)" not in out


def test_explain_rejects_a_rank_outside_the_world(capsys):
    path = os.path.join(ROOT, "scenarios", "01-recipe-2d-mesh.toml")
    assert cli.main(["explain", path, "--rank", "9"]) == 2
    assert "rank 9 is not in the world" in capsys.readouterr().err


def test_the_plain_ops_table_keeps_every_bracket_of_the_docs(capsys):
    assert cli.main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "src[names] (as_list: src[[names...]]" in out  # rich read "[[names...]]" as markup and ate it


def test_a_log_dir_that_cannot_be_written_is_exit_2_in_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    script = os.path.join(ROOT, "tests", "launch_scripts", "exits.py")
    assert cli.main(["launch", "--log-dir", str(blocker / "logs"), script]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--log-dir" in err[0] and "Traceback" not in err[0]


def test_a_launch_too_large_for_one_machine_says_so_without_options_launch_does_not_have(capsys):
    script = os.path.join(ROOT, "tests", "launch_scripts", "exits.py")
    assert cli.main(["launch", "--nnodes", "20", "--nproc-per-node", "8", script]) == 2
    err = capsys.readouterr().err
    assert "at most 64" in err and "--tier" not in err


def test_a_sample_larger_than_the_world_is_refused(capsys):
    assert cli.main(["fuzz", "--tier", "fake", "--ranks", "100", "--examples", "1"]) == 2
    assert "--ranks 100 is more than the 8 ranks" in capsys.readouterr().err


def test_a_scenario_that_ends_otherwise_names_the_step_whose_name_is_misspelt(tmp_path, capsys):
    path = tmp_path / "typo.toml"
    path.write_text('format = 2\n[topology]\nhosts = 1\ndevices_per_host = 2\n'
                    '[[step]]\nop = "init_device_mesh"\nshape = [2]\nnames = ["tp"]\nout = "m"\n'
                    '[[step]]\nop = "all_reduce"\nmesh = "m"\ndim = "tpp"\nskip_on = [1]\n'
                    '[expect]\noutcome = "hang"\n')
    assert cli.main(["run", str(path), "--tier", "model"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "step 1 (all_reduce) raises" in out and "tpp" in out and "misspelt" in out


def test_a_scenario_that_passes_only_because_a_misspelt_name_raises_everywhere_does_not_pass(tmp_path, capsys):
    # the model predicts torch's KeyError on every rank, so the run "agrees": the typo must still be named (format 2;
    # a file without a format is read as 0.2 meant it, where that passed: tests/test_scenario_formats.py)
    path = tmp_path / "typo.toml"
    path.write_text('format = 2\n[topology]\nhosts = 1\ndevices_per_host = 2\n'
                    '[[step]]\nop = "init_device_mesh"\nshape = [2]\nnames = ["tp"]\nout = "m"\n'
                    '[[step]]\nop = "all_reduce"\nmesh = "m"\ndim = "tpp"\n'
                    '[expect]\noutcome = "pass"\n')
    assert cli.main(["run", str(path), "--tier", "model"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "step 1 (all_reduce) raises" in out and "tpp" in out and "expect_error = true" in out
    path.write_text(path.read_text().replace('op = "all_reduce"', 'op = "all_reduce"\nexpect_error = true'))
    assert cli.main(["run", str(path), "--tier", "model"]) == 0


def test_replay_rebuilds_a_hang_from_its_dumps_runs_it_and_exits_1_as_run_does_when_it_reproduces(tmp_path, capsys):
    dumps = os.path.join(ROOT, "tests", "data", "flight_recorder", "skip_on_mesh_dim", "dumps")
    assert cli.main(["replay", dumps, "--deadline", "3", "--scenario-out", str(tmp_path / "s.toml")]) == 1
    out = capsys.readouterr().out
    assert "culprit ranks 5" in out and "replayed: hang — as the dumps say" in out
    assert cli.main(["run", str(tmp_path / "s.toml"), "--tier", "model"]) == 0  # anyone can re-run the file


@pytest.mark.parametrize("where", ["/proc/meshsim-nope/logs", "/proc/self/status/logs"])
def test_a_log_dir_the_system_refuses_even_to_root_is_exit_2_in_one_line(where, capsys):
    # root passes os.access everywhere, and /proc still refuses a mkdir: only trying tells
    script = os.path.join(ROOT, "tests", "launch_scripts", "exits.py")
    assert cli.main(["launch", "--log-dir", where, script]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("meshsim: error: --log-dir") and "Traceback" not in err[0]
