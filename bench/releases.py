"""Every torch release meshsim admits, checked alike, each in its own virtual environment.

    python bench/releases.py matrix   [--releases 2.9.1,2.15.0] [--venvs DIR] [--install] [--json OUT]
    python bench/releases.py findings [--releases ...] [--venvs DIR] [--write]

`matrix` runs, on each release, what a user runs: a default sweep on 2 x 4, the scenarios, the recipe's
`hsdp.py` under `meshsim launch`, a replay of Flight Recorder dumps, a seeded bug in torch's DeviceMesh (it must
be caught), and the compatibility layer's test; it prints a table of outcome and time per release and check, and
exits 1 when any check does not end as it must.

`findings` runs each finding's scenario (a file under scenarios/ whose [expect] names it) on each release, with
every finding excused (meshsim.model.findings.MEASURING), and records what the run showed: `holds` (torch did
what the finding says), `fixed` (torch did what is right), `differs` (neither), `n/a` (the release lacks a step).
`--write` stores that in meshsim/model/findings-measured.toml, which `meshsim findings` reports, and regenerates
the table in docs/findings.md.

A release's environment is DIR/torch-<release> (default: $MESHSIM_VENVS, else ~/.cache/meshsim/venvs), made once
with `--install` (torch from PyPI, meshsim's dependencies; CUDA builds of several GB run without a GPU). The
repository's own meshsim is what every run imports (PYTHONPATH), from a scratch directory.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meshsim.core.releases import KNOWN, parse, text  # noqa: E402
from meshsim.model.findings import MEASURED, MEASURING, REGISTRY  # noqa: E402

DEPENDENCIES = ["numpy", "hypothesis>=6.100", "pytest>=8", "pytest-xdist>=3.5", "multiprocess>=0.70.16",
                "dill>=0.3.8", "rich>=13", "coverage>=7", "tomli-w>=1.0"]
SEEDED_MODULE = "torch.distributed.device_mesh"
SEEDED_LINE = "return not_none(get_rank(mesh_dim_group))"  # get_local_rank, on every release 2.9.1-2.15.0
SEEDED_BUG = "return not_none(get_rank(mesh_dim_group)) ^ (get_world_size(mesh_dim_group) == 4)"


@dataclass
class Check:
    """One thing a user runs: its command (after `python`), the exit code it must end with, its time limit."""

    name: str
    argv: list[str]
    exit_code: int
    limit_s: float
    seeded: bool = False


def checks(release: str = text(KNOWN[-1])) -> list[Check]:
    scenarios = runnable_scenarios(release)
    return [
        # seed 1 draws, on 2.9.1, a gather of nested uneven shards whose empty shards 2.9's F.pad refuses (rule
        # pad-empty-dims): a hang the model predicts, which the matrix of releases checks on every run
        Check("sweep", ["-m", "meshsim", "fuzz", "--hosts", "2", "--devices-per-host", "4", "--examples", "100",
                        "--seed", "1"], 0, 600),
        Check("scenarios", ["-m", "meshsim", "run", *scenarios], 0, 600),
        Check("launch", ["-m", "meshsim", "launch", "--nnodes", "2", "--nproc-per-node", "4", "--deadline", "120",
                         str(ROOT / "meshsim" / "examples" / "scripts" / "hsdp.py")], 0, 300),
        Check("replay", ["-m", "meshsim", "replay", str(ROOT / "tests" / "data" / "flight_recorder" /
                                                         "skip_on_mesh_dim" / "dumps"), "--deadline", "5"], 1, 300),
        Check("seeded bug", ["-m", "meshsim", "fuzz", "--hosts", "2", "--devices-per-host", "4", "--examples", "100",
                             "--seed", "1", "--shrink-budget", "10"], 1, 300, seeded=True),
        # the simulated GPU's tests too: its patches reach deeper into torch (DTensor's strategies, the allocator)
        Check("compat", ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                         *(str(ROOT / "tests" / name) for name in ("test_compat.py", "test_simgpu.py",
                                                                   "test_simgpu_memory.py"))], 0, 600),
    ]


def runnable_scenarios(release: str) -> list[str]:
    """The scenarios whose steps `release` has (one that needs a newer torch exits 2 there, by design)."""
    from meshsim.ops import validate
    from meshsim.scenario.files import load
    from meshsim.spec.fields import PlanError

    kept = []
    for path in sorted(glob.glob(str(ROOT / "scenarios" / "*.toml"))):
        scenario = load(path)
        try:
            validate(scenario.plan, scenario.topology.world, parse(release))
        except PlanError:
            continue
        kept.append(path)
    return kept


@dataclass
class Result:
    release: str
    check: str
    ok: bool
    exit_code: int | None
    seconds: float
    tail: str = ""


# --------------------------------------------------------------------------------------------- environments


def venvs_dir(given: str | None) -> Path:
    return Path(given or os.environ.get("MESHSIM_VENVS") or Path.home() / ".cache" / "meshsim" / "venvs")


def python_of(venvs: Path, release: str) -> Path:
    return venvs / f"torch-{release}" / "bin" / "python"


def install(venvs: Path, release: str) -> float:
    """Make DIR/torch-<release> once (pip's cache keeps the wheels for the next machine run); its seconds."""
    python = python_of(venvs, release)
    if python.exists() and _run([str(python), "-c", "import torch, hypothesis, rich"], 120)[0] == 0:
        return 0.0
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(python.parent.parent)], check=True)
    empty = venvs / "no-constraints.txt"
    empty.parent.mkdir(parents=True, exist_ok=True)
    empty.write_text("")  # this machine's pip caps torch through a constraint file: a newer release needs none
    env = {**os.environ, "PIP_CONSTRAINT": str(empty)}
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"torch=={release}", *DEPENDENCIES], check=True, env=env, timeout=1800)
    return time.monotonic() - started


def _installed(venvs: Path, release: str) -> bool:
    """Install one; a registry that cannot serve it is said in one line (the machine's network, not meshsim)."""
    try:
        print(f"torch {release}: environment ready in {install(venvs, release):.0f} s", flush=True)
        return True
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"torch {release}: could not be installed ({exc}); not checked", file=sys.stderr, flush=True)
        return False


def available(venvs: Path, releases: list[str]) -> list[str]:
    return [r for r in releases if python_of(venvs, r).exists()]


# --------------------------------------------------------------------------------------------- running


def _run(argv: list[str], limit_s: float, env: dict[str, str] | None = None, cwd: str | None = None
         ) -> tuple[int | None, str]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=limit_s, env=env, cwd=cwd,
                             start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        return None, f"over {limit_s:.0f} s\n{_text(exc.stdout)}{_text(exc.stderr)}"
    return out.returncode, out.stdout + out.stderr


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value or ""


def environment(python: Path, scratch: str, seeded: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHSIM_MUTANT", "PYTEST_XDIST"))}
    paths = [str(ROOT)]
    if seeded:
        paths.insert(0, str(ROOT / "bench" / "mutant_site"))
        env["MESHSIM_MUTANT_MODULE"] = SEEDED_MODULE
        env["MESHSIM_MUTANT_FILE"] = seeded_copy(python, scratch)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["NO_COLOR"] = "1"
    return env


def seeded_copy(python: Path, scratch: str) -> str:
    """torch's device_mesh.py of this release with one bug: get_local_rank is wrong on every dim of size 4."""
    source = subprocess.run([str(python), "-c", "import torch.distributed.device_mesh as m; print(m.__file__)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    code = Path(source).read_text()
    if code.count(SEEDED_LINE) != 1:
        raise SystemExit(f"{source}: the seeded bug's line is not there once; update SEEDED_LINE")
    target = Path(scratch) / "device_mesh.py"
    target.write_text(code.replace(SEEDED_LINE, SEEDED_BUG))
    return str(target)


def run_matrix(venvs: Path, releases: list[str]) -> list[Result]:
    results = []
    for release in releases:
        python = python_of(venvs, release)
        for check in checks(release):
            with tempfile.TemporaryDirectory(prefix=f"meshsim-{release}-") as scratch:
                env = environment(python, scratch, check.seeded)
                started = time.monotonic()
                code, out = _run([str(python), *check.argv], check.limit_s, env, scratch)
                seconds = time.monotonic() - started
            ok = code == check.exit_code
            if check.seeded and not all(r.ok for r in results if r.release == release and r.check == "sweep"):
                ok, out = False, "the sweep fails without the bug: catching it says nothing\n" + out
            results.append(Result(release, check.name, ok, code, seconds, "" if ok else out[-1500:]))
            print(f"torch {release} {check.name}: {'ok' if ok else 'FAILED'} (exit {code}, {seconds:.0f} s)",
                  flush=True)
    return results


def print_matrix(results: list[Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    names = [c.name for c in checks()]
    table = Table(title="meshsim on each torch release (outcome, seconds; scenarios: those the release can run)",
                  title_justify="left")
    table.add_column("torch")
    for name in names:
        table.add_column(name, justify="right")
    for release in dict.fromkeys(r.release for r in results):
        row = {r.check: r for r in results if r.release == release}
        table.add_row(release, *[f"{'ok' if row[n].ok else 'FAILED'} {row[n].seconds:.0f}" if n in row else "-"
                                 for n in names])
    Console().print(table)
    for r in results:
        if not r.ok:
            print(f"\n--- torch {r.release} {r.check}: exit {r.exit_code}\n{r.tail}")


# --------------------------------------------------------------------------------------------- findings


def finding_scenarios() -> dict[str, str]:
    """Finding id -> the scenario that shows it (under scenarios/, the first by name)."""
    found: dict[str, str] = {}
    for path in sorted(glob.glob(str(ROOT / "scenarios" / "**" / "*.toml"), recursive=True)):
        with open(path, "rb") as f:
            expect = tomllib.load(f).get("expect", {})
        for fid in expect.get("findings", []):
            found.setdefault(fid, os.path.relpath(path, ROOT))
    return found


def measure(python: Path, scenario: str, fid: str, tries: int = 3) -> str:
    """holds, fixed, differs or n/a: what `scenario`'s runs on this release showed of finding `fid`. A finding
    whose outcome torch leaves to chance (a crossed rendezvous may connect) is tried again before `fixed`."""
    for _ in range(tries):
        state = _measure_once(python, scenario, fid)
        if state != "fixed":
            return state
    return state


def _measure_once(python: Path, scenario: str, fid: str) -> str:
    with tempfile.TemporaryDirectory(prefix="meshsim-finding-") as scratch:
        env = {**environment(python, scratch), MEASURING: "1"}
        code, out = _run([str(python), "-m", "meshsim", "run", "--json", str(ROOT / scenario)], 300, env, scratch)
    if code == 2 and "needs torch" in out:
        return "n/a"
    try:
        run = json.loads(out[out.index("["):])[0]
    except (ValueError, IndexError, KeyError):
        return "differs"
    if fid in {f["id"] for f in run.get("findings", [])}:
        return "holds"
    return "fixed" if not run.get("differences") and run.get("outcome") == run.get("expected_outcome") else "differs"


def run_findings(venvs: Path, releases: list[str], jobs: int, only: set[str] | None = None) -> dict[str, dict]:
    """Every finding's scenario on every release, `jobs` runs at a time (a run mostly waits on its ranks)."""
    from concurrent.futures import ThreadPoolExecutor

    todo = {fid: scenario for fid, scenario in finding_scenarios().items()
            if fid in REGISTRY and (only is None or fid in only)}
    with ThreadPoolExecutor(jobs) as pool:
        futures = {(fid, release): pool.submit(measure, python_of(venvs, release), scenario, fid)
                   for fid, scenario in todo.items() for release in releases}
        fixes = {(fid, release): pool.submit(measure, python_of(venvs, release), REGISTRY[fid].fix_scenario, fid)
                 for fid in todo if REGISTRY[fid].fix_scenario for release in releases}
        measured: dict[str, dict] = {}
        for fid, scenario in todo.items():
            states = {release: futures[fid, release].result() for release in releases}
            measured[fid] = {"scenario": scenario, "releases": states}
            if REGISTRY[fid].fix_scenario:  # the way out, where the release has it: fixed, else n/a
                measured[fid]["fix_scenario"] = REGISTRY[fid].fix_scenario
                measured[fid]["with_fix"] = {release: fixes[fid, release].result() for release in releases}
            print(f"{fid}: {measured[fid]}", flush=True)
    return measured


def write_findings(measured: dict[str, dict]) -> None:
    """Store the measurement (merged over what an earlier run of other findings stored) and the docs table."""
    import tomli_w

    if MEASURED.exists():
        measured = {**tomllib.loads(MEASURED.read_text()), **measured}
    header = "# Measured by `python bench/releases.py findings --write`: where each finding's scenario shows it.\n"
    MEASURED.write_text(header + tomli_w.dumps(dict(sorted(measured.items()))))
    page = ROOT / "docs" / "findings.md"
    before, rest = page.read_text().split("<!-- measured:begin -->\n", 1)
    _, after = rest.split("<!-- measured:end -->", 1)
    page.write_text(before + "<!-- measured:begin -->\n" + findings_table(measured) + "<!-- measured:end -->" + after)


def findings_table(measured: dict[str, dict]) -> str:
    releases = sorted({r for m in measured.values() for r in m["releases"]}, key=parse)
    lines = ["| finding | scenario | " + " | ".join(releases) + " |", "| --- | --- |" + " --- |" * len(releases)]
    for fid, m in sorted(measured.items()):
        lines.append(f"| `{fid}` | `{m['scenario']}` | " + " | ".join(m["releases"].get(r, "") for r in releases)
                     + " |")
        if "with_fix" in m:  # the way out a release gives: `fixed` where it has it
            lines.append(f"| `{fid}`, {REGISTRY[fid].fixed_with} | `{m['fix_scenario']}` | "
                         + " | ".join(m["with_fix"].get(r, "") for r in releases) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- the command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/releases.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["matrix", "findings"])
    parser.add_argument("--releases", default=",".join(text(r) for r in KNOWN),
                        help="comma-separated releases (default: every release meshsim knows); "
                             "'oldest' and 'newest' name the ends")
    parser.add_argument("--venvs", help="where the environments are (torch-<release> each)")
    parser.add_argument("--install", action="store_true", help="make the environments that are missing")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--write", action="store_true", help="findings: store the measurement and the docs table")
    parser.add_argument("--jobs", type=int, default=2, help="findings: scenario runs at a time (default 2)")
    parser.add_argument("--only", help="findings: these ids alone (comma-separated)")
    args = parser.parse_args(argv)
    known = [text(r) for r in KNOWN]
    releases = [{"oldest": known[0], "newest": known[-1]}.get(r.strip(), r.strip())
                for r in args.releases.split(",") if r.strip()]
    venvs = venvs_dir(args.venvs)
    if args.install:
        releases = [r for r in releases if _installed(venvs, r)]
        if not releases:
            print("no torch release could be installed: nothing checked", file=sys.stderr)
            return 0
    missing = sorted(set(releases) - set(available(venvs, releases)), key=parse)
    if missing:
        print(f"no environment for torch {', '.join(missing)} in {venvs} (--install makes them)", file=sys.stderr)
        return 2
    if args.what == "findings":
        measured = run_findings(venvs, releases, args.jobs, set(args.only.split(",")) if args.only else None)
        if args.write:
            write_findings(measured)
        return 0
    results = run_matrix(venvs, releases)
    print_matrix(results)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
