"""`meshsim replay` timings, next to torch's own analyzer on the same dumps, measured in the same run.

    python bench/replay.py               # 8 and 16 recorded ranks, 64, 256 and 1,024 generated (a minute or two)
    python bench/replay.py --run         # also the end-to-end command: dumps to verdict, replayed on the process tier

Columns: reading the dumps (torch's loader behind meshsim's plain-data check); rebuilding the job, naming the
culprits and writing and validating the scenario; torch's analyzer (build_db, what `torchfrtrace` runs) once on the
same dumps, with the groups meshsim rebuilt where gloo's dumps have none (it fails on them as they are) -- the
baseline: what a user gets today; and `meshsim replay --tier none` as a command (a fresh Python: torch's import
included). Medians of repeated runs in one process. Asserts nothing.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "flight_recorder")
sys.path.insert(0, ROOT)
sys.path.insert(0, DATA)


def _median(fn, repeat: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times), value


def _torch_once(dumpset, incident) -> float:
    """One run of torch's analyzer on the dumps (as listed), groups filled in where gloo left none."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig

    from meshsim.replay import torch_analyzer as ta

    details = {os.path.basename(d.path): {"host_name": f"host_rank{d.rank}", "rank": d.rank, "entries": d.entries,
                                          "version": d.version, "pg_config": d.pg_config} for d in dumpset.dumps}
    if not ta._configured(dumpset):
        details = ta._with_groups(details, incident)
    args = JobConfig().parse_args([dumpset.directory] + (["--allow-incomplete-ranks"] if incident.missing else []))
    began = time.perf_counter()
    with ta._quiet():
        ta._build(build_db, details, args, dumpset.version)
    return time.perf_counter() - began


def _command(directory: str, tier: str, deadline: float) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    with tempfile.TemporaryDirectory() as out:
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "meshsim", "replay", directory, "--tier", tier, "--deadline",
                               str(deadline), "--scenario-out", os.path.join(out, "s.toml")], env=env,
                              capture_output=True, text=True, check=False)
        return time.perf_counter() - began, done.returncode


def main(argv: list[str]) -> None:
    import synth

    from meshsim.replay import analyze, build, read_dir, to_scenario

    console = Console()
    warm = read_dir(os.path.join(DATA, "skip_on_mesh_dim", "dumps"))  # imports (torch's loader, the plan language)
    to_scenario(build(warm), analyze(build(warm))).scenario()
    console.print(f"load average before: {os.getloadavg()[0]:.1f} (2 cores shared: compare within this run only)")
    table = Table(title="meshsim replay, next to torch's analyzer on the same dumps", title_justify="left")
    for column in ("world", "read", "rebuild, diagnose, write the scenario", "torch's analyzer (baseline)",
                   "`meshsim replay --tier none` (command)", "culprits"):
        table.add_column(column)
    with tempfile.TemporaryDirectory() as scratch:
        worlds = [("8 (skip_on_mesh_dim, recorded)", os.path.join(DATA, "skip_on_mesh_dim", "dumps")),
                  ("16 (skip_on_mesh_dim_16, recorded)", os.path.join(DATA, "skip_on_mesh_dim_16", "dumps"))]
        for side in (8, 16, 32):
            directory = os.path.join(scratch, f"w{side * side}")
            synth.write(directory, shape=(side, side), names=("dp", "tp"), steps=3, skip=(side + 5, 1, "tp"))
            worlds.append((f"{side * side} ({side} x {side}, synth.py)", directory))
        for label, directory in worlds:
            repeat = 5 if "1024" not in label else 2
            read, dumpset = _median(lambda d=directory: read_dir(d), repeat)

            def rest(ds=dumpset):
                incident = build(ds)
                analysis = analyze(incident)
                to_scenario(incident, analysis).scenario()
                return incident, analysis

            rebuilt, (incident, analysis) = _median(rest, repeat)
            baseline = statistics.median(_torch_once(dumpset, incident) for _ in range(min(repeat, 3)))
            command, _ = _command(directory, "none", 5)
            table.add_row(label, f"{read * 1000:.1f} ms", f"{rebuilt * 1000:.1f} ms", f"{baseline * 1000:.1f} ms",
                          f"{command:.1f} s", str(analysis.culprits))
    console.print(table)
    if "--run" in argv:
        seconds, code = _command(os.path.join(DATA, "skip_on_mesh_dim", "dumps"), "process", 3)
        console.print(f"`meshsim replay` of skip_on_mesh_dim on the process tier, deadline 3 s: {seconds:.1f} s "
                      f"end to end, exit {code}")
        with tempfile.TemporaryDirectory() as scratch:
            synth.write(scratch, shape=(8, 8), names=("dp", "tp"), steps=3, skip=(13, 1, "tp"))
            seconds, code = _command(scratch, "process", 20)
        console.print(f"`meshsim replay` of 64 ranks (8 x 8, synth.py) on the process tier, deadline 20 s: "
                      f"{seconds:.1f} s end to end, exit {code}")
    console.print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
