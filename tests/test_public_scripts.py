"""The public PyTorch distributed examples, verbatim, under `meshsim launch` with their documented flags: they exit
as on a GPU cluster of that shape, and their losses equal those of the same script's CPU twin under torchrun.

What runs, and why it behaves as it does on real hardware: tests/launch_scripts/public/SOURCES.toml.
"""

import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLIC = os.path.join(ROOT, "tests", "launch_scripts", "public")
HARNESS = os.path.join(ROOT, "tests", "launch_scripts", "losses.py")
with open(os.path.join(PUBLIC, "SOURCES.toml"), "rb") as fh:
    SOURCES = tomllib.load(fh)
RUNS = {run["name"]: run for run in SOURCES["run"]}
TIMEOUT = 900


def runs(selected=lambda run: True):
    return [pytest.param(name, marks=[pytest.mark.slow] if run.get("slow") else [])
            for name, run in RUNS.items() if selected(run)]


def world(run):
    """The number of ranks torchrun's flags ask for (--nnodes x --nproc-per-node)."""
    flags = " ".join(run["flags"]).replace("_", "-").replace("=", " ").split()
    nodes = int(flags[flags.index("--nnodes") + 1]) if "--nnodes" in flags else 1
    return nodes * int(flags[flags.index("--nproc-per-node") + 1])


def workdir(run, where):
    shutil.copytree(os.path.join(PUBLIC, run["dir"]), where)
    return str(where)


def meshsim_launch(run, cwd, *command):
    return subprocess.run([sys.executable, "-m", "meshsim", "launch", "--deadline", "600", *run["flags"], *command],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)


def torchrun(run, cwd, *command):
    env = dict(os.environ, PYTHONPATH="")  # the CPU twin runs on plain torch: nothing of meshsim
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(world(run)), *command], capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd,
                          env=env)


def expected(run):
    """(exit code, failing ranks, error) the run must end with, as on a GPU cluster."""
    if run.get("needs") and importlib.util.find_spec(run["needs"]) is not None:
        return 0, [], None
    if run["exit"] == 0 and not run.get("needs"):
        return 0, [], None
    return 1, run["failing_ranks"], run["error"]


def failed_ranks(stderr):
    line = re.search(r"exit codes by rank: (.*)", stderr)
    assert line, stderr[-3000:]
    codes = dict(item.split(":") for item in line.group(1).split(", "))
    return sorted(int(rank) for rank, code in codes.items() if code not in ("0", "None"))


def test_the_vendored_scripts_are_the_public_files_unmodified():
    for entry in SOURCES["file"]:
        with open(os.path.join(PUBLIC, entry["local"]), "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == entry["sha256"], entry["local"]
        assert entry["local"].endswith(entry["path"]) and len(entry["commit"]) == 40


@pytest.mark.parametrize("name", runs(lambda run: not run.get("losses")))
def test_a_public_script_exits_under_meshsim_launch_as_on_a_gpu_cluster(name, tmp_path):
    """(A run whose losses are compared exits 0 there, with the loss harness around it.)"""
    run = RUNS[name]
    cwd = workdir(run, tmp_path / "run")
    out = meshsim_launch(run, cwd, run["script"], *run.get("args", []))
    code, ranks, error = expected(run)
    assert out.returncode == code, out.stdout[-2000:] + out.stderr[-4000:]
    if code:
        assert failed_ranks(out.stderr) == ranks and error in out.stderr, out.stderr[-4000:]
        return
    assert "all ranks exited 0" in out.stderr
    if "again" in run:
        again = meshsim_launch(run, cwd, run["script"], *run["again"])
        assert again.returncode == 0, again.stderr[-4000:]


def cpu_twin(run, source, where):
    """The script's directory with its CPU edits: each edit must apply exactly once, or the twin is not the same
    script any more."""
    shutil.copytree(source, where)
    for edit in run["cpu_edit"]:
        path = os.path.join(where, edit["file"])
        with open(path) as fh:
            text = fh.read()
        assert text.count(edit["old"]) == 1, f"{edit['file']}: {edit['old']!r}"
        with open(path, "w") as fh:
            fh.write(text.replace(edit["old"], edit["new"]))
    return str(where)


def losses(out_dir, ranks):
    result = []
    for rank in range(ranks):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as fh:
            result.append(json.load(fh))
    return result


def assert_same_losses(simulated, cpu):
    assert len(simulated) == len(cpu)
    for rank, (ours, theirs) in enumerate(zip(simulated, cpu)):
        assert ours and len(ours) == len(theirs), (rank, ours, theirs)
        for step, (a, b) in enumerate(zip(ours, theirs)):
            same = math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5) or (math.isnan(a) and math.isnan(b))
            assert same, f"rank {rank} step {step}: {a} != {b}"


def twin_runs(run, sim, cpu, tmp_path, label, args):
    ours = meshsim_launch(run, sim, HARNESS, str(tmp_path / f"sim-{label}"), run["script"], *args)
    assert ours.returncode == 0, ours.stderr[-4000:]
    theirs = torchrun(run, cpu, HARNESS, str(tmp_path / f"cpu-{label}"), run["script"], *args)
    assert theirs.returncode == 0, theirs.stderr[-4000:]
    assert_same_losses(losses(tmp_path / f"sim-{label}", world(run)), losses(tmp_path / f"cpu-{label}", world(run)))


@pytest.mark.parametrize("name", runs(lambda run: run.get("losses")))
def test_a_public_scripts_losses_equal_its_cpu_twin_under_torchrun(name, tmp_path):
    """Every rank's loss at every step, under meshsim's simulated GPUs and under torchrun on CPU/gloo."""
    run = RUNS[name]
    sim = workdir(run, tmp_path / "sim")
    if run["losses"] == "resumed":
        # the first run initializes with DTensor's RNG, which (as on GPUs) a simulated GPU mesh uses and a CPU
        # mesh does not: the twins compare from the same checkpoint, the one the simulated run saved
        first = meshsim_launch(run, sim, run["script"])
        assert first.returncode == 0, first.stderr[-4000:]
        cpu = cpu_twin(run, sim, tmp_path / "cpu")
        twin_runs(run, sim, cpu, tmp_path, "resumed", run["again"])
        return
    cpu = cpu_twin(run, sim, tmp_path / "cpu")
    twin_runs(run, sim, cpu, tmp_path, "first", run.get("args", []))
    if "again" in run:
        twin_runs(run, sim, cpu, tmp_path, "again", run["again"])
