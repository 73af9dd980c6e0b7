"""`meshsim launch`: run an unmodified torchrun script on a simulated H hosts x D devices, bounded, diagnosed.

Each rank is a bare worker process (meshsim.run, script mode) that runs the script as __main__ with torchrun's
environment for its simulated host. When the machine has fewer GPUs than ranks, every simulated host shows D
GPUs living in CPU memory (meshsim.run.simgpu) and NCCL becomes gloo; with enough GPUs they are used for real.
A rank that waits past the deadline in a collective or a group creation ends the run with meshsim's diagnosis.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TextIO

from . import deadlines
from .errors import InputError
from .judge.verdict import Failed, Verdict, judge
from .spec.tiers import TIERS
from .spec.topology import Topology
from .wire import RunScript


class LaunchError(InputError):
    """Bad usage of launch (a script that does not exist); nothing was started."""


LaunchResult = Verdict  # the names 0.2 had
LaunchFailed = Failed


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


def launch(script: str, topology: Topology, args: list[str] | tuple = (), deadline: float = deadlines.LAUNCH_S,
           module: bool = False, log_dir: str | None = None, stream: TextIO | None = None,
           simulate_gpus: bool | None = None) -> LaunchResult:
    """Run `script` (or `module`) on every rank of a simulated topology, as torchrun would; returns the result.

    stream: where rank output goes live, each line prefixed "[rankN]:" (None: nowhere); log_dir: one file per rank.
    simulate_gpus: None = when the machine has fewer GPUs than ranks.
    """
    from .run.process import ProcessExecutor

    target = resolve(script, module)
    deadline = deadlines.checked(deadline)
    most = TIERS["process"].max_world
    if topology.world > most:
        raise LaunchError(f"{topology} is {topology.world} ranks; meshsim launch runs a process per rank, at most "
                          f"{most} on one machine")
    if simulate_gpus is None:
        simulate_gpus = _gpus() < topology.world
    outputs = [""] * topology.world
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        for rank in range(topology.world):
            Path(log_dir, f"rank{rank}.log").write_text("")  # one file a rank, silent ones too
    echo = _echo(outputs, stream, log_dir)
    backend = "gloo" if simulate_gpus else "nccl"
    flight = os.path.join(log_dir, "flight_recorder") if log_dir is not None else None
    with ProcessExecutor(topology, backend=backend, deadline=deadline, script=True, simulated_gpus=simulate_gpus,
                         echo=echo, flight_recorder=flight) as executor:
        record = executor.execute(RunScript(target, module, list(args), deadline))
    echo.flush()
    verdict = judge(record, "script", script=target, topology=topology)
    if log_dir is not None and verdict.diagnosis is not None:
        from .report import save_picture

        save_picture(verdict, log_dir)
    return verdict


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


def main(args: Any) -> int:
    """The CLI: exit 0 when every rank exits 0, 1 for a failed rank or a hang, 2 for bad usage."""
    from .report import make_console, render_verdict

    topology = Topology(args.nnodes, args.nproc_per_node)
    result = launch(args.target, topology, args.args, deadline=args.deadline, module=args.module,
                    log_dir=args.log_dir, stream=sys.stdout)
    render_verdict(result, make_console(stderr=True), groups=args.groups)
    if result.record.stopped == "interrupted":
        return 130
    return 0 if result.passed else 1
