"""`meshsim launch` beside `torchrun --standalone` of the same scripts (imported by bench.py: the `launch` section).

Each example script runs unchanged under `meshsim launch` on simulated hosts x GPUs, and under torchrun on this
machine's CPU with gloo after a device edit (cpu_edit: "cuda" -> "cpu", "nccl" -> "gloo", no set_device, no DDP
device ids), with the same number of ranks, in a fresh working directory each. Rounds alternate the two; tables
show medians. Per-step time is (time of many steps - time of few steps) / (many - few), for scripts that take a
step count. The hang row times a script that prints first and then hangs: from its first line to the verdict.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from rich.table import Table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECIPE = os.path.join(ROOT, "meshsim", "examples", "scripts")
TESTS = os.path.join(ROOT, "tests", "launch_scripts")
GOAL = 1.2  # meshsim launch at most this many times torchrun's time


@dataclass(frozen=True)
class Example:
    path: str
    hosts: int
    devices: int
    args: tuple[str, ...] = ()
    steps: tuple[str, int, int] | None = None  # (argument template, few, many): per-step time from two runs
    edit: tuple[tuple[str, str], ...] = ()  # what cpu_edit leaves to do for this script (text, replacement)

    @property
    def name(self) -> str:
        return os.path.relpath(self.path, ROOT)

    def argv(self, steps: int | None = None) -> list[str]:
        return [a.format(steps=steps) for a in self.args] if steps is not None else list(self.args)


EXAMPLES = [
    Example(os.path.join(RECIPE, "2d_setup.py"), 1, 8),
    Example(os.path.join(RECIPE, "2d_setup_with_device_mesh.py"), 2, 4),
    Example(os.path.join(RECIPE, "3d_custom_parallel.py"), 2, 4),
    Example(os.path.join(RECIPE, "hsdp.py"), 2, 4, edit=(  # FSDP1 refuses the CPU unless told it is the device
        ("HYBRID_SHARD\n", 'HYBRID_SHARD, device_id=__import__("torch").device("cpu")\n'),)),
    Example(os.path.join(TESTS, "fsdp2_dtensor.py"), 2, 2),
    Example(os.path.join(TESTS, "ddp_cuda.py"), 2, 2),
    Example(os.path.join(HERE, "scripts", "ddp_steps.py"), 2, 4, ("--steps", "{steps}"), ("{steps}", 2, 22)),
]

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


def cpu_edit(source: str, extra: tuple[tuple[str, str], ...] = ()) -> str:
    for pattern, replacement in CPU_EDIT:
        source = re.sub(pattern, replacement, source)
    for text, replacement in extra:
        source = source.replace(text, replacement)
    return source


def _run(command: list[str], env_path: str) -> tuple[float, bool, str]:
    """(seconds, exit 0, rank 0's last line) of a command in a fresh working directory (torchrun shows rank 0's
    output alone, meshsim prefixes it "[rank0]:")."""
    with tempfile.TemporaryDirectory(prefix="meshsim-bench-") as work:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, env_path]), TMPDIR=work)  # (torchrun's log dir)
        env.pop("OMP_NUM_THREADS", None)  # both launchers set it to 1 for several ranks a host
        started = time.monotonic()
        out = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=work, env=env)
        seconds = time.monotonic() - started
    lines = [line.removeprefix("[rank0]:") for line in out.stdout.splitlines()
             if line.startswith("[rank0]:") or not line.startswith("[rank")]
    return seconds, out.returncode == 0, (lines[-1] if lines else "")


def _commands(example: Example, edited: str, steps: int | None) -> tuple[list[str], list[str]]:
    ours = [sys.executable, "-m", "meshsim", "launch", "--nnodes", str(example.hosts), "--nproc-per-node",
            str(example.devices), example.path, *example.argv(steps)]
    theirs = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
              str(example.hosts * example.devices), "--local-ranks-filter", "0", edited, *example.argv(steps)]
    return ours, theirs


def _measure(example: Example, edited: str, rounds: int, steps: int | None = None) -> dict:
    ours_cmd, theirs_cmd = _commands(example, edited, steps)
    where = os.path.dirname(example.path)
    ours, theirs, ok, same = [], [], [True, True], True
    for _ in range(rounds):
        seconds, passed, ours_line = _run(ours_cmd, where)
        ours.append(seconds)
        ok[0] &= passed
        seconds, passed, theirs_line = _run(theirs_cmd, where)
        theirs.append(seconds)
        ok[1] &= passed
        same &= ours_line == theirs_line
    return {"ours": statistics.median(ours), "theirs": statistics.median(theirs), "ok": ok, "same": same,
            "rounds": (ours, theirs)}


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def scripts_table(console, rounds: int) -> list[tuple[Example, str]]:
    table = Table(title=f"Example scripts: whole-command wall time, median of {rounds} alternating rounds "
                        f"(goal: meshsim launch <= {GOAL}x torchrun)")
    for col in ("script", "ranks", "torchrun --standalone, CPU edit (s)", "meshsim launch, unchanged (s)", "ratio",
                "exit 0 (ours/torchrun)", "same rank-0 last line", "load"):
        table.add_column(col, justify="right")
    kept = []
    with tempfile.TemporaryDirectory(prefix="meshsim-bench-cpu-") as edits:
        for example in EXAMPLES:
            if not os.path.exists(example.path):
                table.add_row(example.name, "-", "-", "-", "-", "(not in this tree)", "-", "-")
                continue
            edited = os.path.join(edits, os.path.basename(example.path))
            with open(example.path) as source, open(edited, "w") as out:
                out.write(cpu_edit(source.read(), example.edit))
            steps = example.steps[1] if example.steps else None
            m = _measure(example, edited, rounds, steps)
            ratio = m["ours"] / m["theirs"]
            table.add_row(example.name, f"{example.hosts}x{example.devices}", f"{m['theirs']:.2f}", f"{m['ours']:.2f}",
                          f"[{'green' if ratio <= GOAL else 'red'}]{ratio:.2f}[/]",
                          f"{'yes' if m['ok'][0] else 'NO'}/{'yes' if m['ok'][1] else 'NO'}",
                          "yes" if m["same"] else "no", _load())
            if example.steps:
                kept.append((example, edited))
        console.print(table)
        steps_table(console, kept, rounds)
    return kept


def steps_table(console, examples: list[tuple[Example, str]], rounds: int) -> None:
    table = Table(title="Per-step time: (many steps - few steps) / (many - few), medians of the runs' wall times")
    for col in ("script", "steps", "torchrun ms/step", "meshsim launch ms/step", "ratio", "load"):
        table.add_column(col, justify="right")
    for example, edited in examples:
        assert example.steps is not None
        _, few, many = example.steps
        per = {}
        low, high = _measure(example, edited, rounds, few), _measure(example, edited, rounds, many)
        for side in ("ours", "theirs"):
            per[side] = (high[side] - low[side]) / (many - few) * 1000
        ratio = per["ours"] / per["theirs"] if per["theirs"] > 0 else float("nan")
        table.add_row(example.name, f"{few} vs {many}", f"{per['theirs']:.1f}", f"{per['ours']:.1f}",
                      f"[{'green' if ratio <= GOAL else 'red'}]{ratio:.2f}[/]", _load())
    console.print(table)


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
    from meshsim.launcher import launch

    table = Table(title="A hung script (rank 5 skips a tp all_reduce) on 2x4: from its first line to the verdict "
                        "with the diagnosis (goal: <= deadline + 1 s)")
    for col in ("deadline (s)", "diagnosed after (s)", "over the deadline (s)", "culprits", "load"):
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
    scripts_table(console, rounds)
    hang_table(console)
