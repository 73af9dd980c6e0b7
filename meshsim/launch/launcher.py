"""`meshsim launch`: run an unmodified torchrun script on a simulated H hosts x D devices, bounded, diagnosed.

Each rank is a bare worker process (meshsim.run, script mode) that runs the script as __main__ with what torchrun
gives a worker on its host: its environment (for this attempt), the host's name and, with host_dirs, the host's
own working directory, and torchrun's thread setting. When the machine has fewer GPUs than ranks, every simulated
host shows its GPUs living in CPU memory (meshsim.compat.simgpu) and NCCL becomes gloo; with enough GPUs they are
used for real. A rank that waits past the deadline in a collective or a group creation ends the run with
meshsim's diagnosis. A failure restarts every rank, as torchrun's elastic agent does, up to max_restarts times.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from ..core import deadlines
from ..core.outcome import CRASH, ERROR
from ..core.wire import RunScript, ScriptHost
from ..judge.verdict import Failed, Verdict, judge
from ..spec.tiers import TIERS
from ..spec.topology import Topology
from .logs import RankLogs
from .options import LaunchError, LaunchOptions, request_of

LaunchResult = Verdict  # the names 0.2 had
LaunchFailed = Failed
HOSTNAME = "meshsim-host{}"  # simulated host h's name (socket.gethostname() on its ranks)

__all__ = ["launch", "LaunchError", "LaunchOptions", "LaunchResult", "LaunchFailed", "main"]


def resolve(target: str, is_module: bool) -> str:
    if is_module:
        import importlib.util

        sys.path.insert(0, os.getcwd())  # as `python -m` (torchrun runs `python -u -m`) looks here first
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        finally:
            sys.path.remove(os.getcwd())
        if found is None:
            raise LaunchError(f"no module named {target!r}")
        return target
    if not os.path.isfile(target):
        raise LaunchError(f"{target}: no such script")
    return os.path.abspath(target)


def launch(script: str, topology: Topology, args: list[str] | tuple = (), deadline: float = deadlines.LAUNCH_S,
           module: bool = False, log_dir: str | None = None, stream: TextIO | None = None,
           simulate_gpus: bool | None = None, errors: TextIO | None = None,
           notify: Callable[[str], None] | None = None, **options: Any) -> LaunchResult:
    """Run `script` (or `module`) on every rank of a simulated topology, as torchrun would; returns the result.

    stream: where rank output goes live, each line prefixed "[rankN]:" (None: nowhere); errors: where the ranks'
    stderr goes where it is kept apart (--redirects/--tee; default: stream); log_dir: a file a rank, and
    torchrun's layout a host; simulate_gpus: None = when the machine has fewer GPUs than the hosts have;
    notify: told of each restart; options: meshsim.launch.options.LaunchOptions (max_restarts, host_dirs,
    gpus_per_host, run_id, role, redirects, tee, local_ranks_filter, ...). Each attempt has `deadline` seconds.
    """
    from ..run.process import ProcessExecutor

    settings = LaunchOptions(**options)
    target = checked(script, module, topology)
    deadline = deadlines.checked(deadline)
    host_gpus = settings.gpus_per_host or topology.devices_per_host
    if simulate_gpus is None:  # real GPUs serve a rank each, D a host
        simulate_gpus = _gpus() < max(topology.world, topology.hosts * host_gpus) or \
            host_gpus != topology.devices_per_host
    gpus = 1 if settings.virtual_local_rank else host_gpus  # what a rank sees
    logs = RankLogs(topology, settings, log_dir, stream, errors if errors is not None else stream)
    flight = os.path.join(log_dir, "flight_recorder") if log_dir is not None else None
    with ProcessExecutor(topology, backend="gloo" if simulate_gpus else "nccl", deadline=deadline,
                         start_timeout=settings.start_timeout, script=True, simulated_gpus=simulate_gpus, echo=logs,
                         flight_recorder=flight, gpus_per_host=gpus, split_streams=settings.split_streams,
                         gpu=settings.gpu) as executor:
        earlier: list[Verdict] = []
        for attempt in range(settings.max_restarts + 1):
            if attempt:
                executor.renew()  # every rank, as torchrun's agent restarts the whole worker group
            hosts = _hosts(topology, settings, attempt, logs, simulated=simulate_gpus)
            record = executor.execute(RunScript(target, module, list(args), deadline, hosts, os.getcwd()))
            logs.flush()
            verdict = judge(record, "script", script=target, topology=topology)
            if verdict.outcome not in (ERROR, CRASH) or record.stopped == "interrupted" or \
                    attempt == settings.max_restarts:
                break
            earlier.append(verdict)
            if notify is not None:
                notify(f"attempt {attempt} failed ({restart_reason(verdict)}); restarting every rank "
                       f"(restart {attempt + 1} of --max-restarts {settings.max_restarts})")
    verdict.attempts = earlier
    logs.close()
    if logs.torchrun_dir is not None and log_dir is None:
        verdict.record.notes.append(f"torchrun's log files (--redirects/--tee, error.json) are in {logs.torchrun_dir}")
    if log_dir is not None and verdict.diagnosis is not None:
        from ..judge.report import save_picture

        save_picture(verdict, log_dir)
    return verdict


def checked(script: str, module: bool, topology: Topology) -> str:
    """The script's path (or the module's name), once it is known to exist and the world to fit; LaunchError."""
    target = resolve(script, module)
    most = TIERS["process"].max_world
    if topology.world > most:
        raise LaunchError(f"{topology} is {topology.world} ranks; meshsim launch runs a process per rank, at most "
                          f"{most} on one machine")
    return target


def _hosts(topology: Topology, settings: LaunchOptions, attempt: int, logs: RankLogs,
           simulated: bool) -> tuple[ScriptHost, ...]:
    """What torchrun's agent on each simulated host gives each of its workers for this attempt."""
    omp = os.environ.get("OMP_NUM_THREADS")
    if omp is None and topology.devices_per_host > 1:
        omp = "1"  # torchrun sets it for every worker when it is unset and a host runs more than one
    threads = int(omp) if omp is not None and omp.strip().isdigit() and int(omp) > 0 else None
    run_id = settings.run_id if settings.run_id is not None else _run_id(topology)
    envs: list[dict[str, str | None]] = []
    for rank in range(topology.world):
        env: dict[str, str | None] = {
            "TORCHELASTIC_RESTART_COUNT": str(attempt), "TORCHELASTIC_MAX_RESTARTS": str(settings.max_restarts),
            "TORCHELASTIC_RUN_ID": run_id, "ROLE_NAME": settings.role, "OMP_NUM_THREADS": omp,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": settings.signals_to_handle, "TORCHELASTIC_ERROR_FILE": None}
        if settings.virtual_local_rank:  # each worker sees only its own GPU, as device 0
            local = topology.local_rank(rank)
            env["LOCAL_RANK"] = "0"
            env["CUDA_VISIBLE_DEVICES"] = str(local) if simulated else topology.gpu_slice(rank).split(",")[local]
        envs.append(env)
    logs.attempt(attempt, envs)
    names = tuple(HOSTNAME.format(h) for h in range(topology.hosts))
    disks = [os.getcwd()] * topology.hosts  # one disk, shared (a shared file system)
    scratch: list[str | None] = [None] * topology.hosts
    if settings.host_dirs is not None:  # a disk a host, each with its own temporary directory
        disks = [os.path.join(os.path.abspath(settings.host_dirs), f"host{h}") for h in range(topology.hosts)]
        scratch = [os.path.join(disk, "tmp") for disk in disks]
        for directory in scratch:
            os.makedirs(str(directory), exist_ok=True)
    return tuple(ScriptHost(envs[rank], names[topology.host_of(rank)], names, disks[topology.host_of(rank)],
                            scratch[topology.host_of(rank)], threads)
                 for rank in range(topology.world))


def _run_id(topology: Topology) -> str:
    """torchrun's job id when none is given: a fresh uuid4 on one node (it rendezvous on localhost:0), "none" with
    static rendezvous across nodes."""
    import uuid

    return str(uuid.uuid4()) if topology.hosts == 1 else "none"


def restart_reason(verdict: Verdict) -> str:
    """Why an attempt failed, in one line: its first failure's ranks and error."""
    from ..judge.report import failure_lines

    lines = failure_lines(verdict)
    return lines[0] if lines else verdict.outcome


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(args: Any) -> int:
    """The CLI: exit 0 when every rank exits 0, 1 for a failed rank or a hang, 2 for bad usage."""
    from ..judge.report import make_console, render_verdict

    request = request_of(args)
    console = make_console(stderr=True)

    def notify(line: str) -> None:
        console.print(f"meshsim: {line}", markup=False, highlight=False, soft_wrap=True)

    checked(request.target, request.is_module, request.topology)  # bad usage is said alone, before any note
    for note in request.notes:
        notify(note)

    result = launch(request.target, request.topology, request.args, deadline=request.deadline,
                    module=request.is_module, log_dir=request.log_dir, stream=sys.stdout, errors=sys.stderr,
                    notify=notify, **vars(request.options))
    render_verdict(result, console, groups=request.groups)
    if result.record.stopped == "interrupted":
        return 130
    return 0 if result.passed else 1
