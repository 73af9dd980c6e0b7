"""`meshsim launch`: run an unmodified torchrun script on a simulated H hosts x D devices, bounded, diagnosed.

Each rank is a bare worker process (meshsim.run, script mode) that runs the script as __main__ with torchrun's
environment for its simulated host. When the machine has fewer GPUs than ranks, every simulated host shows D
GPUs living in CPU memory (meshsim.run.simgpu) and NCCL becomes gloo; with enough GPUs they are used for real.
A rank that waits past the deadline in a collective or a group creation ends the run with meshsim's diagnosis.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from . import deadlines
from .outcome import HANG, PASS, outcome_of
from .spec.topology import Topology
from .wire import DIED, RunScript

LAUNCH_S = 300.0  # a script's default deadline: a training script may take minutes


class LaunchError(ValueError):
    """Bad usage of launch (a script that does not exist); nothing was started."""


@dataclass
class LaunchResult:
    topology: Topology
    outcome: str  # pass | error (a rank exited non-zero or raised) | hang | crash (a rank died)
    exit_codes: list[int | None]  # per rank; None: it never finished
    tracebacks: list[str]
    record: Any
    diagnosis: Any = None
    outputs: list[str] = field(default_factory=list)
    script: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome == PASS

    def raise_for_outcome(self) -> "LaunchResult":
        """Raise LaunchFailed (an AssertionError carrying the whole report) unless every rank exited 0."""
        if not self.passed:
            raise LaunchFailed(self)
        return self

    def report(self) -> str:
        import io

        from rich.console import Console

        buffer = io.StringIO()
        render(self, Console(file=buffer, width=160, color_system=None, force_terminal=False), groups=True)
        return buffer.getvalue()


class LaunchFailed(AssertionError):
    def __init__(self, result: LaunchResult):
        super().__init__("\n" + result.report())
        self.result = result


def resolve(target: str, is_module: bool) -> str:
    if is_module:
        import importlib.util

        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise LaunchError(f"no module named {target!r}")
        return target
    if not os.path.isfile(target):
        raise LaunchError(f"{target}: no such script")
    return os.path.abspath(target)


def launch(script: str, topology: Topology, args: list[str] | tuple = (), deadline: float = LAUNCH_S,
           module: bool = False, log_dir: str | None = None, stream: TextIO | None = None,
           simulate_gpus: bool | None = None) -> LaunchResult:
    """Run `script` (or `module`) on every rank of a simulated topology, as torchrun would; returns the result.

    stream: where rank output goes live, each line prefixed "[rankN]:" (None: nowhere); log_dir: one file per rank.
    simulate_gpus: None = when the machine has fewer GPUs than ranks.
    """
    from .run import Cluster

    target = resolve(script, module)
    deadline = deadlines.checked(deadline)
    if simulate_gpus is None:
        simulate_gpus = _gpus() < topology.world
    outputs = [""] * topology.world
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        for rank in range(topology.world):
            Path(log_dir, f"rank{rank}.log").write_text("")  # one file a rank, silent ones too
    echo = _echo(outputs, stream, log_dir)
    backend = "gloo" if simulate_gpus else "nccl"
    with Cluster(topology, backend=backend, deadline=deadline, script=True, simulated_gpus=simulate_gpus,
                 echo=echo) as cluster:
        record = cluster.execute(RunScript(target, module, list(args), deadline))
    echo.flush()
    return _result(topology, record, outputs, target)


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class _echo:
    """Rank output as it arrives: kept whole, in a log file a rank, and live on `stream`, each line prefixed
    "[rankN]:". Output arrives in pieces that need not end at a line's end (print writes its parts one by one),
    so a line is shown only once it is complete; flush() shows what is left at the end."""

    def __init__(self, outputs: list[str], stream: TextIO | None, log_dir: str | None):
        self.outputs, self.stream, self.log_dir = outputs, stream, log_dir
        self.partial: dict[int, str] = {}

    def __call__(self, rank: int, text: str) -> None:
        self.outputs[rank] += text
        if self.log_dir is not None:
            with open(os.path.join(self.log_dir, f"rank{rank}.log"), "a") as fh:
                fh.write(text)
        *lines, self.partial[rank] = (self.partial.get(rank, "") + text).split("\n")
        self._show(rank, lines)

    def flush(self) -> None:
        for rank, rest in sorted(self.partial.items()):
            self._show(rank, [rest] if rest else [])
        self.partial.clear()

    def _show(self, rank: int, lines: list[str]) -> None:
        if self.stream is not None and lines:
            self.stream.write("".join(f"[rank{rank}]:{line}\n" for line in lines))
            self.stream.flush()


def _result(topology: Topology, record: Any, outputs: list[str], script: str) -> LaunchResult:
    from .judge.diagnose import diagnose

    codes: list[int | None] = []
    tracebacks: list[str] = []
    for state in record.states:
        done = state.value
        codes.append(done.exit_code if done is not None else state.exitcode if state.end == DIED else None)
        tracebacks.append(done.traceback if done is not None else "")
    outcome = outcome_of((s.end for s in record.states), record.timed_out)
    result = LaunchResult(topology, outcome, codes, tracebacks, record, outputs=outputs, script=script)
    if outcome == HANG or record.died:
        result.diagnosis = diagnose(record)
    return result


# ------------------------------------------------------------------------------------------ the report

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def where_in_script(stack: str, script: str) -> str | None:
    """The innermost frame of the user's code in a faulthandler stack: "train.py:42 (in step)"."""
    base = os.path.dirname(script) if os.path.isfile(script) else None
    for match in _FRAME.finditer(stack):  # most recent call first
        path = match.group("file")
        if path == script or (base and path.startswith(base + os.sep) and "site-packages" not in path):
            return f"{os.path.basename(path)}:{match.group('line')} (in {match.group('func')})"
    return None


def grouped_tracebacks(result: LaunchResult) -> list[tuple[list[int], str, str]]:
    """Identical failures merged: (ranks, "RuntimeError: ... at 2d_setup.py:13", the traceback from the script on).

    Failures are the same when their exception type, place in the script and message agree but for numbers
    (rank 4 and rank 5 failing on "device 4" and "device 5" are one failure).
    """
    groups: dict[str, tuple[list[int], str, str]] = {}
    for rank, text in enumerate(result.tracebacks):
        if not text:
            continue
        text = _from_script_on(text, result.script)
        last = [line for line in text.strip().splitlines() if line.strip()][-1].strip()
        at = _script_line(text, result.script)
        title = f"{last} at {at}" if at else last
        key = re.sub(r"\d+", "N", title)
        groups.setdefault(key, ([], title, text))[0].append(rank)
    return [(ranks, title, text) for ranks, title, text in groups.values()]


def _script_line(text: str, script: str) -> str | None:
    """The last place in the user's script that the traceback passes (where the failure started for them)."""
    found = [m for m in re.finditer(r'File "([^"]+)", line (\d+)', text) if m.group(1) == script]
    return f"{os.path.basename(script)}:{found[-1].group(2)}" if found else None


def _from_script_on(text: str, script: str) -> str:
    """A traceback without meshsim's and runpy's frames above the script's first one."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if f'File "{script}"' in line), None)
    if first is None:
        return text
    return "\n".join(lines[:1] + lines[first:])


def group_map(record: Any, topology: Topology) -> tuple[list[tuple], list[str]]:
    """Every process group the script made: (name, ranks, hosts, what made it); and ranks left out of a kind."""
    groups: dict[str, tuple[tuple[int, ...], str]] = {}
    for state in record.states:
        for name, ranks in state.created.items():
            kind = state.created_as.get(name, "new_group")
            groups.setdefault(name, (ranks, kind))
    rows = []
    for name, (ranks, kind) in sorted(groups.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
        hosts = sorted({topology.host_of(r) for r in ranks})
        rows.append((name, list(ranks), hosts, kind))
    notes = []
    for kind in dict.fromkeys(kind for *_, kind in rows):
        members = {r for _, ranks, _, k in rows if k == kind for r in ranks}
        left = sorted(set(range(topology.world)) - members)
        if left and members:
            from .report import ranks_text

            notes.append(f"ranks {ranks_text(left)} are in none of the groups made by {kind} (others are)")
    return rows, notes


def render(result: LaunchResult, console: Any, groups: bool = False) -> None:
    from rich.table import Table

    from .report import ranks_text, render_diagnosis

    codes = ", ".join(f"{r}:{c}" for r, c in enumerate(result.exit_codes))
    head = {PASS: "all ranks exited 0"}.get(result.outcome, result.outcome)
    console.print(f"meshsim launch {os.path.basename(result.script)} on {result.topology} "
                  f"({result.record.elapsed:.2f} s): {head}", markup=False, highlight=False)
    if not result.passed:
        console.print(f"  exit codes by rank: {codes}", markup=False, highlight=False)
    for ranks, key, text in grouped_tracebacks(result):
        console.print(f"ranks {ranks_text(ranks)}: {key}", style="bold red", markup=False, highlight=False)
        console.print("  " + text.strip().replace("\n", "\n  "), style="dim", markup=False, highlight=False)
    if result.diagnosis is not None:
        render_diagnosis(result.diagnosis, console)
        for rank, stack in sorted(result.record.stacks.items()):
            at = where_in_script(stack, result.script)
            if at:
                console.print(f"  rank {rank} is at {at}", markup=False, highlight=False)
    if groups or not result.passed:
        rows, notes = group_map(result.record, result.topology)
        table = Table(title="Process groups the script created", title_justify="left")
        for col in ("group", "ranks", "hosts", "made by"):
            table.add_column(col)
        for name, ranks, hosts, kind in rows:
            table.add_row(name, ranks_text(ranks), ",".join(map(str, hosts)), kind)
        if rows:
            console.print(table)
        for note in notes:
            console.print(f"  {note}", style="yellow", markup=False, highlight=False)


def main(args: Any) -> int:
    """The CLI: exit 0 when every rank exits 0, 1 for a failed rank or a hang, 2 for bad usage."""
    from .report import make_console

    topology = Topology(args.nnodes, args.nproc_per_node)
    result = launch(args.target, topology, args.args, deadline=args.deadline, module=args.module,
                    log_dir=args.log_dir, stream=sys.stdout)
    render(result, make_console(stderr=True), groups=args.groups)
    return 0 if result.passed else 1
