"""How much of torch's DeviceMesh a sweep reaches: line and branch coverage (coverage.py) of
torch/distributed/device_mesh.py and its layout module, measured inside the ranks.

Each rank process records into its own data file (saved after every plan, so a rank killed for a hang keeps
what it reached); the controller combines them. Code that cannot run on a CPU/gloo cluster (CUDA device setup,
NCCL's split_group, torchcomms, XLA) is excluded by the patterns in meshsim/data/coverage-exclusions.toml, each
with the reason it was reviewed for, so the percentage is of what a sweep here can reach.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import tempfile
import tomllib
from dataclasses import dataclass, field
from typing import Any

EXCLUSIONS = os.path.join(os.path.dirname(__file__), "data", "coverage-exclusions.toml")
MODULES = ("torch/distributed/device_mesh.py", "torch/distributed/_mesh_layout.py")


def targets() -> list[str]:
    """The two files, where this Python's torch has them (without importing torch)."""
    spec = importlib.util.find_spec("torch")
    base = os.path.dirname(list(spec.submodule_search_locations or [""])[0]) if spec else ""
    return [os.path.join(base, module) for module in MODULES]


def start_in_rank(data_file: str) -> Any:
    """Begin measuring in a rank process; returns the Coverage object (save() it after each plan)."""
    import coverage

    cov = coverage.Coverage(data_file=data_file, data_suffix=True, branch=True, include=targets(),
                            config_file=False)
    cov.start()
    return cov


def measure_import(data_dir: str) -> None:
    """The ranks import torch before measuring starts (the forkserver preloads it), so the modules' import-time
    lines (imports, def and class statements) run unseen there; record them in a fresh process instead."""
    import subprocess
    import sys

    code = ("import sys; from meshsim.torch_coverage import start_in_rank; cov = start_in_rank(sys.argv[1]); "
            "import torch.distributed.device_mesh; cov.stop(); cov.save()")
    subprocess.run([sys.executable, "-c", code, os.path.join(data_dir, "rank")], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def exclusions() -> list[dict]:
    with open(EXCLUSIONS, "rb") as f:
        return tomllib.load(f)["exclude"]


@dataclass
class FileReach:
    path: str
    statements: int
    missing_lines: list[int]
    branches: int
    missing_branches: list[list[int]]
    excluded_lines: int

    @property
    def line_percent(self) -> float:
        return 100.0 * (self.statements - len(self.missing_lines)) / max(1, self.statements)

    @property
    def branch_percent(self) -> float:
        return 100.0 * (self.branches - len(self.missing_branches)) / max(1, self.branches)


@dataclass
class Reach:
    files: list[FileReach] = field(default_factory=list)
    reasons: list[dict] = field(default_factory=list)

    @property
    def branch_percent(self) -> float:
        total = sum(f.branches for f in self.files)
        return 100.0 * (total - sum(len(f.missing_branches) for f in self.files)) / max(1, total)

    def to_json(self) -> dict:
        return {"branch_percent": round(self.branch_percent, 1),
                "files": [{"file": f.path, "line_percent": round(f.line_percent, 1),
                           "branch_percent": round(f.branch_percent, 1), "missing_lines": f.missing_lines,
                           "missing_branches": f.missing_branches, "excluded_lines": f.excluded_lines}
                          for f in self.files]}


def combine(data_dir: str) -> Reach:
    """Combine the ranks' data files under data_dir and measure them against the reviewed exclusions."""
    import coverage

    rules = exclusions()
    measure_import(data_dir)
    cov = coverage.Coverage(data_file=os.path.join(data_dir, "combined"), branch=True, include=targets(),
                            config_file=False)
    for rule in rules:
        cov.exclude(rule["pattern"])
    cov.combine(glob.glob(os.path.join(data_dir, "rank.*")), keep=True)
    cov.save()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "reach.json")
        cov.json_report(outfile=out, ignore_errors=True)
        with open(out) as f:
            data = json.load(f)["files"]
    reach = Reach(reasons=rules)
    for module, path in zip(MODULES, targets()):
        entry = next((v for k, v in data.items() if os.path.realpath(k) == os.path.realpath(path)), None)
        if entry is None:  # no rank reached the file at all
            continue
        summary = entry["summary"]
        reach.files.append(FileReach(module, summary["num_statements"], entry["missing_lines"],
                                     summary["num_branches"], entry["missing_branches"], summary["excluded_lines"]))
    return reach
