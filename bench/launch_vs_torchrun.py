"""`meshsim launch` beside `torchrun --standalone` of the same scripts (imported by bench.py: the `launch` section).

Each example script runs unchanged under `meshsim launch` (simulated hosts x GPUs, its own torchrun flags), and
its CPU twin runs under `torchrun --standalone` with the same number of ranks on this machine's CPU with gloo. The
twin is a copy of the script's directory with the device edited: the public scripts carry their own edits
(tests/launch_scripts/public/SOURCES.toml, [[run.cpu_edit]]), the recipe's and meshsim's own get cpu_edit's
("cuda" -> "cpu", "nccl" -> "gloo", no set_device, no DDP device ids). Every run has a fresh working directory.
Rounds alternate the two; tables show medians. Per-step time is the median time between two optimizer steps on
rank 0, taken in the same runs by a wrapper both launchers run the script under (scripts/step_clock.py: torch's
global optimizer-step hook, then the script as __main__). The hang row times a script that prints first and then
hangs: from its first line to the verdict with the diagnosis.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass

from rich.table import Table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECIPE = os.path.join(ROOT, "meshsim", "examples", "scripts")
TESTS = os.path.join(ROOT, "tests", "launch_scripts")
PUBLIC = os.path.join(TESTS, "public")
GOAL = 1.2  # meshsim launch at most this many times torchrun's time


@dataclass(frozen=True)
class Example:
    name: str
    path: str  # the script, run unchanged by meshsim launch
    flags: tuple[str, ...]  # meshsim launch's flags (torchrun's)
    args: tuple[str, ...] = ()
    edits: tuple[tuple[str, str, str], ...] = ()  # (file in the script's directory, old, new) for the CPU twin
    generic_edit: bool = True  # apply CPU_EDIT to the script (public scripts carry their own edits instead)

    @property
    def world(self) -> int:
        from meshsim.cli import build_parser
        from meshsim.launch.options import request_of

        return request_of(build_parser().parse_args(["launch", *self.flags, self.path])).topology.world


def _ours(script: str, hosts: int, devices: int, *args: str, edits: tuple[tuple[str, str, str], ...] = ()) -> Example:
    return Example(os.path.relpath(script, ROOT), script, ("--nnodes", str(hosts), "--nproc-per-node", str(devices)),
                   args, edits)


EXAMPLES = [
    _ours(os.path.join(RECIPE, "2d_setup.py"), 1, 8),
    _ours(os.path.join(RECIPE, "2d_setup_with_device_mesh.py"), 2, 4),
    _ours(os.path.join(RECIPE, "3d_custom_parallel.py"), 2, 4),
    _ours(os.path.join(RECIPE, "hsdp.py"), 2, 4, edits=(  # FSDP1 refuses the CPU unless told it is the device
        ("hsdp.py", "HYBRID_SHARD\n", 'HYBRID_SHARD, device_id=__import__("torch").device("cpu")\n'),)),
    _ours(os.path.join(TESTS, "fsdp2_dtensor.py"), 2, 2),
    _ours(os.path.join(TESTS, "ddp_cuda.py"), 2, 2),
    _ours(os.path.join(HERE, "scripts", "ddp_steps.py"), 2, 4, "--steps", "30"),
]
CLOCK = os.path.join(HERE, "scripts", "step_clock.py")

CPU_EDIT = [  # a GPU script's device lines, as one edits them to run it under torchrun on a CPU
    (r"(?m)^(\s*)torch\.cuda\.set_device\(.*\)\s*$", r"\1pass"),
    (r"torch\.cuda\.device_count\(\)", 'int(__import__("os").environ["LOCAL_WORLD_SIZE"])'),
    (r"torch\.device\(\s*[\"']cuda[\"'][^)]*\)", 'torch.device("cpu")'),
    (r"device_ids\s*=\s*\[[^\]]*\]", "device_ids=None"),
    (r"output_device\s*=\s*[\w.\[\]\"']+", "output_device=None"),
    (r"[\"']cuda(:\d+)?[\"']", '"cpu"'),
    (r"[\"']nccl[\"']", '"gloo"'),
    (r"\.cuda\(\)", ".cpu()"),
]


def cpu_edit(source: str) -> str:
    for pattern, replacement in CPU_EDIT:
        source = re.sub(pattern, replacement, source)
    return source


def public_examples(slow: bool = False) -> list[Example]:
    """The vendored public scripts' runs that pass on real hardware and have a CPU twin (SOURCES.toml)."""
    sources = os.path.join(PUBLIC, "SOURCES.toml")
    if not os.path.exists(sources):
        return []
    with open(sources, "rb") as fh:
        runs = tomllib.load(fh).get("run", [])
    out = []
    for run in runs:
        if run.get("exit", 0) != 0 or not run.get("cpu_edit") or (run.get("slow") and not slow):
            continue
        script = os.path.join(PUBLIC, run["dir"], run["script"])
        edits = tuple((e["file"], e["old"], e["new"]) for e in run["cpu_edit"])
        out.append(Example(run["name"], script, tuple(run.get("flags", ())), tuple(run.get("args", ())), edits,
                           generic_edit=False))
    return out


def cpu_twin(example: Example, into: str) -> str:
    """A copy of the script's directory with its device edited; returns the twin script's path."""
    source = os.path.dirname(example.path)
    twin = os.path.join(into, re.sub(r"\W", "_", example.name))
    shutil.copytree(source, twin, ignore=shutil.ignore_patterns("__pycache__", "public"))
    script = os.path.join(twin, os.path.basename(example.path))
    if example.generic_edit:
        with open(script) as fh:
            text = cpu_edit(fh.read())
        with open(script, "w") as fh:
            fh.write(text)
    for name, old, new in example.edits:
        path = os.path.join(twin, name)
        with open(path) as fh:
            text = fh.read()
        if old not in text:
            raise ValueError(f"{example.name}: the CPU edit of {name} no longer applies: {old!r}")
        with open(path, "w") as fh:
            fh.write(text.replace(old, new))
    return script


def _run(command: list[str]) -> tuple[float, bool, str, float | None]:
    """(seconds, exit 0, rank 0's last line, ms between optimizer steps) of a command in a fresh working directory
    (torchrun shows rank 0's output alone, meshsim prefixes it "[rank0]:")."""
    with tempfile.TemporaryDirectory(prefix="meshsim-bench-") as work:
        env = dict(os.environ, PYTHONPATH=ROOT, TMPDIR=work)  # (torchrun's log directory goes in it too)
        env.pop("OMP_NUM_THREADS", None)  # both launchers set it to 1 for several ranks a host
        started = time.monotonic()
        out = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=work, env=env)
        seconds = time.monotonic() - started
    lines = [line.removeprefix("[rank0]:").strip() for line in out.stdout.splitlines()
             if line.startswith("[rank0]:") or not line.startswith("[rank")]
    clock = [float(line.split()[1]) for line in lines if line.startswith("STEP_MS ")]
    said = [line for line in lines if not line.startswith("STEP_MS ")]
    return seconds, out.returncode == 0, (said[-1] if said else ""), (clock[-1] if clock else None)


def _measure(example: Example, twin: str, rounds: int) -> dict:
    """Both launchers, `rounds` times each, alternating: medians of wall time and of per-step time."""
    ours_cmd = [sys.executable, "-m", "meshsim", "launch", *example.flags, CLOCK, example.path, *example.args]
    theirs_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                  str(example.world), "--local-ranks-filter", "0", CLOCK, twin, *example.args]
    runs: dict[str, list] = {"ours": [], "theirs": []}
    for _ in range(rounds):
        for side, command in (("ours", ours_cmd), ("theirs", theirs_cmd)):
            runs[side].append(_run(command))
    out: dict = {"ok": [all(r[1] for r in runs[side]) for side in ("ours", "theirs")],
                 "same": all(a[2] == b[2] for a, b in zip(runs["ours"], runs["theirs"]))}
    for side, results in runs.items():
        out[side] = statistics.median(r[0] for r in results)
        steps = [r[3] for r in results if r[3] is not None]
        out[f"{side}_step"] = statistics.median(steps) if steps else None
    return out


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def _ratio(ours: float, theirs: float) -> str:
    ratio = ours / theirs if theirs > 0 else float("nan")
    return f"[{'green' if ratio <= GOAL else 'red'}]{ratio:.2f}[/]"


def scripts_table(console, examples: list[Example], rounds: int, twins: dict[str, str]) -> None:
    wall = Table(title=f"Example scripts: whole-command wall time, median of {rounds} alternating rounds "
                       f"(goal: meshsim launch <= {GOAL}x torchrun)")
    for col in ("script", "flags (meshsim launch)", "ranks", "torchrun --standalone, CPU twin (s)",
                "meshsim launch, unchanged (s)", "ratio", "exit 0 (ours/torchrun)", "same rank-0 last line",
                "load (1 min)"):
        wall.add_column(col, justify="right", overflow="fold")
    step = Table(title="Per-step time: median time between two optimizer steps on rank 0, medians over the same runs "
                       f"(goal: <= {GOAL}x)")
    for col in ("script", "ranks", "torchrun ms/step", "meshsim launch ms/step", "ratio"):
        step.add_column(col, justify="right", overflow="fold")
    for example in examples:
        m = _measure(example, twins[example.name], rounds)
        wall.add_row(example.name, " ".join(example.flags), str(example.world), f"{m['theirs']:.2f}",
                     f"{m['ours']:.2f}", _ratio(m["ours"], m["theirs"]),
                     f"{'yes' if m['ok'][0] else 'NO'}/{'yes' if m['ok'][1] else 'NO'}", "yes" if m["same"] else "no",
                     _load())
        if m["ours_step"] is not None and m["theirs_step"] is not None:
            step.add_row(example.name, str(example.world), f"{m['theirs_step']:.1f}", f"{m['ours_step']:.1f}",
                         _ratio(m["ours_step"], m["theirs_step"]))
    console.print(wall)
    console.print(step)


HANG = '''print("started", flush=True)
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
x = torch.ones(4, device="cuda")
if dist.get_rank() != 5:
    dist.all_reduce(x, group=mesh.get_group("tp"))
dist.all_reduce(x, group=mesh.get_group("dp"))
'''


class _FirstWrite:
    """A stream that notes when the ranks' first line arrives (the script is running)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def write(self, text: str) -> None:
        if self.at is None:
            self.at = time.monotonic()

    def flush(self) -> None:
        pass


def hang_table(console, deadlines: tuple[float, ...] = (3.0, 10.0)) -> None:
    from meshsim import Topology
    from meshsim.launch.launcher import launch

    table = Table(title="A hung script (rank 5 skips a tp all_reduce) on 2x4: from its first line to the verdict "
                        "with the diagnosis (goal: <= deadline + 1 s)")
    for col in ("deadline (s)", "diagnosed after (s)", "over the deadline (s)", "culprits", "load (1 min)"):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory(prefix="meshsim-bench-hang-") as work:
        script = os.path.join(work, "hang.py")
        with open(script, "w") as fh:
            fh.write(HANG)
        for deadline in deadlines:
            first = _FirstWrite()
            result = launch(script, Topology(2, 4), deadline=deadline, stream=first)  # type: ignore[arg-type]
            after = time.monotonic() - (first.at or time.monotonic())
            over = after - deadline
            table.add_row(f"{deadline:g}", f"{after:.2f}", f"[{'green' if over <= 1 else 'red'}]{over:+.2f}[/]",
                          str(result.culprits), _load())
    console.print(table)


def launch_section(console, rounds: int = 3) -> None:
    """MESHSIM_SLOW=1 adds the public runs marked slow."""
    examples = EXAMPLES + public_examples(slow=os.environ.get("MESHSIM_SLOW") == "1")
    with tempfile.TemporaryDirectory(prefix="meshsim-bench-twins-") as into:
        twins = {example.name: cpu_twin(example, into) for example in examples}
        scripts_table(console, examples, rounds, twins)
    hang_table(console)
