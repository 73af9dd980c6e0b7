"""Lint and types are part of the suite: ruff (pyflakes, isort, pyupgrade, bugbear) over the tree, and mypy over
meshsim with the pure core (spec, model, judge, record, wire) under strict flags (pyproject.toml)."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is not installed: pip install -e '.[dev]' (the README's set-up does)"
    out = _run(ruff, "check", "--no-cache", ".")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_pure_core_is_under_mypys_strict_flags():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        overrides = tomllib.load(fh)["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if o.get("disallow_untyped_defs") and o.get("disallow_any_generics")]
    covered = {m for o in strict for m in o["module"]}
    assert {"meshsim.spec.*", "meshsim.model.*", "meshsim.judge.*", "meshsim.core.*"} <= covered


def test_mypy_finds_nothing():
    out = _run(sys.executable, "-m", "mypy")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "no issues found" in out.stdout
