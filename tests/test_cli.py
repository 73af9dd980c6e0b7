"""The command line: findings, explain (the model alone), and clean errors."""

import json
import os

from meshsim import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_findings_lists_the_registry_with_versions(capsys):
    assert cli.main(["findings", "--json"]) == 0
    findings = {f["id"]: f for f in json.loads(capsys.readouterr().out)}
    assert {"slice-order-docstring", "group-rank-order", "repeated-rank-accepted", "group-name-collision",
            "gloo-size-mismatch-silent", "localtensormode-not-an-oracle"} <= set(findings)
    assert all(f["applies"] and "2.13.0" in f["verified_on"] for f in findings.values())


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
