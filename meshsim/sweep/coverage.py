"""How much of torch's DeviceMesh and DTensor code a sweep reaches: line and branch coverage (coverage.py),
measured inside the ranks, reported per file.

The files: DeviceMesh (device_mesh.py and its layout module) and DTensor's redistribution (_redistribute.py,
placement_types.py, _collective_utils.py, _utils.py, _api.py) with the part of _ops a DTensor step reaches
(torch.sum's reduction strategy in _math_ops.py). Each rank process records into its own data file (saved after
every plan, so a rank killed for a hang keeps what it reached); the controller combines them. Code that a
CPU/gloo cluster running the plan language cannot reach (CUDA device setup, NCCL's split_group, torch.compile
and tracing, _StridedShard, the graph-based planner, ...) is excluded by the patterns in
meshsim/sweep/coverage-exclusions.toml, each for the files it names and with the reason it was reviewed for, so
the percentage is of what a sweep here can reach.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import tomllib
from dataclasses import dataclass, field

from ..run.coverage import DEVICE_MESH, DTENSOR, MODULES, measure_import, start_in_rank, targets

EXCLUSIONS = os.path.join(os.path.dirname(__file__), "coverage-exclusions.toml")
__all__ = ["DEVICE_MESH", "DTENSOR", "MODULES", "EXCLUSIONS", "Reach", "FileReach", "combine", "exclusions",
           "measure_import", "start_in_rank", "targets"]


def exclusions() -> list[dict]:
    """The reviewed rules; each applies to the files it names (`files`, default: DeviceMesh's two). `kind`:
    "exclude" (default: the line, and the block it opens, do not count) or "partial" (the line's branches need
    not all be taken: the arm no plan can take does not count)."""
    with open(EXCLUSIONS, "rb") as f:
        rules = tomllib.load(f)["exclude"]
    for rule in rules:
        rule.setdefault("files", list(DEVICE_MESH))
    return rules


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
                           "branch_percent": round(f.branch_percent, 1), "branches": f.branches,
                           "missing_lines": f.missing_lines, "missing_branches": f.missing_branches,
                           "excluded_lines": f.excluded_lines}
                          for f in self.files]}


def combine(data_dir: str) -> Reach:
    """Combine the ranks' data files under data_dir and measure each file against its reviewed exclusions."""
    import coverage

    rules = exclusions()
    measure_import(data_dir)
    combined = os.path.join(data_dir, "combined")
    cov = coverage.Coverage(data_file=combined, branch=True, include=targets(), config_file=False)
    cov.combine(glob.glob(os.path.join(data_dir, "rank.*")), keep=True)
    cov.save()
    reach = Reach(reasons=rules)
    for module, path in zip(MODULES, targets()):
        mine = [r for r in rules if module in r["files"]]
        entry = _report(combined, path, [r["pattern"] for r in mine if r.get("kind", "exclude") == "exclude"],
                        [r["pattern"] for r in mine if r.get("kind") == "partial"])
        if entry is None:  # no rank reached the file at all
            continue
        summary = entry["summary"]
        reach.files.append(FileReach(module, summary["num_statements"], entry["missing_lines"],
                                     summary["num_branches"], entry["missing_branches"], summary["excluded_lines"]))
    return reach


def _report(data_file: str, path: str, patterns: list[str], partial: list[str]) -> dict | None:
    """coverage.py's JSON report of one file, with that file's exclusions and partial-branch lines."""
    import coverage

    cov = coverage.Coverage(data_file=data_file, branch=True, include=[path], config_file=False)
    for pattern in patterns:
        cov.exclude(pattern)
    for pattern in partial:
        cov.exclude(pattern, which="partial")
    cov.load()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "reach.json")
        try:
            cov.json_report(morfs=[path], outfile=out, ignore_errors=True)
        except coverage.exceptions.NoDataError:
            return None
        with open(out) as f:
            data = json.load(f)["files"]
    return next((v for k, v in data.items() if os.path.realpath(k) == os.path.realpath(path)), None)
