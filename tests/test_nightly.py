"""`meshsim nightly`: one report (text, JSON, JUnit XML) locally and under torchrun, one node or two."""

import json
import os
import shutil
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_local_nightly_writes_text_json_and_junit(tmp_path):
    out = subprocess.run([sys.executable, "-m", "meshsim", "nightly", "--examples", "15", "--seed", "5",
                          "--json-out", str(tmp_path / "n.json"), "--junit", str(tmp_path / "n.xml")],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all passed" in out.stdout
    report = json.loads((tmp_path / "n.json").read_text())
    suites = {item["suite"] for item in report["items"]}
    assert report["passed"] and report["seed"] == 5 and suites == {"scenario", "fuzz", "example"}
    xml = ET.parse(tmp_path / "n.xml").getroot()
    cases = xml.findall(".//testcase")
    assert len(cases) == len(report["items"]) and not xml.findall(".//failure")


def test_two_torchrun_invocations_act_as_two_nodes(tmp_path):
    port = free_port()
    nodes = [subprocess.Popen(TORCHRUN + ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                                          "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "meshsim-test",
                                          "--max-restarts", "0", "-m", "meshsim", "nightly", "--examples", "2",
                                          "--json-out", str(tmp_path / f"node{n}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
             for n in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    (written,) = [p for p in tmp_path.iterdir()]  # rank 0 writes the report, on whichever node it is
    report = json.loads(written.read_text())
    assert report["topology"] == "2x2" and report["passed"]
    assert len([item for item in report["items"] if not item["skipped"]]) == 3  # 2 fuzz examples, 1 scenario


HANG = """
name = "hang-under-torchrun"
deadline = 3.0
[topology]
hosts = 1
devices_per_host = 4
[[step]]
op = "init_device_mesh"
shape = [2, 2]
names = ["dp", "tp"]
out = "m"
[[step]]
op = "all_reduce"
mesh = "m"
dim = "tp"
skip_on = [1]
[[step]]
op = "check"
mesh = "m"
[expect]
outcome = "pass"
"""


def test_torchrun_on_one_machine_runs_the_suite_on_its_ranks_and_a_hang_ends_at_its_deadline_with_a_diagnosis(
        tmp_path):
    """One torchrun launch (its start is most of this test's time): a scenario that passes, then one that hangs,
    which ends the run (torchrun cannot replace its ranks: the fuzz examples after it do not run)."""
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "hang.toml").write_text(HANG)
    shutil.copy(os.path.join(ROOT, "scenarios", "20-dtensor-on-every-kind-of-mesh.toml"), scenarios)
    out = subprocess.run(TORCHRUN + ["--nproc-per-node", "4", "--standalone", "-m", "meshsim", "nightly",
                                     "--examples", "2", "--scenarios", str(scenarios),
                                     "--json-out", str(tmp_path / "h.json"), "--junit", str(tmp_path / "h.xml")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode != 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "skipped collective" in out.stdout and "Culprit ranks: 1" in out.stdout
    report = json.loads((tmp_path / "h.json").read_text())
    assert report["mode"] == "torchrun" and report["topology"] == "1x4" and not report["passed"]
    outcomes = {item["name"]: item["outcome"] for item in report["items"] if not item["skipped"]}
    assert outcomes == {"dtensor-on-every-kind-of-mesh": "pass", "hang-under-torchrun": "hang"}
    (item,) = [item for item in report["items"] if item["name"] == "hang-under-torchrun"]
    assert item["diagnosis"]["culprit_ranks"] == [1]
    waits = item["diagnosis"]["waiting"]
    assert {w["mesh_dim"] for w in waits} == {"tp"} and {w["rank"] for w in waits} == {0, 1}
    assert len(ET.parse(tmp_path / "h.xml").getroot().findall(".//failure")) == 1


def test_every_part_of_the_suite_that_cannot_run_is_a_skipped_line_and_a_junit_skip(tmp_path):
    out = subprocess.run([sys.executable, "-m", "meshsim", "nightly", "--hosts", "1", "--devices-per-host", "2",
                          "--examples", "0", "--junit", str(tmp_path / "n.xml")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)  # no ./scenarios here
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 cases, all passed; 3 parts skipped" in out.stdout
    skipped = ET.parse(tmp_path / "n.xml").getroot().findall(".//skipped")
    reasons = " | ".join(s.get("message") for s in skipped)
    assert len(skipped) == 3 and "no scenario directory scenarios" in reasons and "--examples 0" in reasons
    assert "2x4 gloo cluster" in reasons
