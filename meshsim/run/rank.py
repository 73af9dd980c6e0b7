"""A rank: one simulated device, booted once and reused for many plans and functions.

`RankSession` is the one boot and the one teardown of every rank meshsim runs, whether a worker process of the
local cluster (meshsim.run.process) or a process torchrun started (meshsim.run.torchrun). A worker process dies
with the controller (PR_SET_PDEATHSIG, and a lifeline pipe whose end-of-file it watches from a thread, which
works even while the main thread is stuck inside C++), dumps its Python stacks on SIGUSR1, and bounds every
torch wait by the run's deadline (meshsim.core.deadlines.torch_wait).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

from ..compat.patching import CompatError
from ..core.deadlines import torch_wait
from ..core.wire import (
    FunctionBegun,
    FunctionDone,
    JoinFailed,
    PlanDone,
    Ready,
    RunFunction,
    RunPlan,
    RunScript,
    ScriptDone,
    StepBegun,
    Stop,
    Teardown,
    dispatch,
    sender,
)
from ..spec.platform import platform_for, uses_nccl
from .reaper import die_with_parent, lead_own_group
from .still import STILL_FOR_S

STACK_SIGNAL = signal.SIGUSR1
# How long a worker process holds a plan's progress (meshsim.compat.progress): well inside the quiet the controller
# needs to call a run still, so a waiting rank has always been heard before that.
HOLD_S = STILL_FOR_S / 3


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    hosts: int
    devices_per_host: int
    port: int
    prefix: str  # store prefix of this generation of workers
    backend: str  # gloo | nccl | cpu:gloo,cuda:nccl
    stack_file: str
    output_file: str  # the rank's stdout and stderr (C++ aborts print there too)
    start_timeout_s: float  # joining the world; torch's waits follow from it by torch_wait()
    script: bool = False  # a bare rank for `meshsim launch`: the user's script makes its own process group
    simulated_gpus: bool = False  # show each simulated host D GPUs in CPU memory (meshsim.compat.simgpu)
    coverage_file: str | None = None  # measure torch's DeviceMesh code here (meshsim.run.coverage)
    flight_recorder: str | None = None  # record collectives, and dump them here on a hang (meshsim.run.flight)
    gpus_per_host: int | None = None  # simulated GPUs a host shows (None: one a rank, devices_per_host)
    error_file: str | None = None  # the rank's stderr apart from its stdout (torchrun's --redirects/--tee)
    gpu: str | None = None  # the card each simulated GPU is (meshsim.compat.simgpu.gpus; None: an H100 80GB)


def _die_with_parent(own_session: bool = False) -> None:
    lead_own_group(own_session)
    die_with_parent()
    if os.getppid() == 1:  # the parent is already gone
        os._exit(3)


def _name_process(name: str) -> None:
    """Show up as meshsim-rN in ps/top (PR_SET_NAME)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(15, ctypes.c_char_p(name.encode()[:15]))
        except OSError:
            pass


def _capture_output(path: str, error_path: str | None = None) -> None:
    """Send this rank's stdout and stderr (Python's and C++'s) to its own file, for the report; stderr to a file
    of its own when `error_path` is given (where a launch must tell the streams apart)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, target in ((1, path), (2, error_path or path)):
        opened = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    # One write per line. C++ (torch's warnings, NCCL) writes to the same file; print() writes a line in pieces,
    # each a write of its own when Python is unbuffered (PYTHONUNBUFFERED, common under torchrun), or a block
    # flushed mid-line otherwise, and native output landed inside a line of the script's.
    sys.stdout = _line_stream(1, sys.stdout)
    sys.stderr = _line_stream(2, sys.stderr)


def _line_stream(fd: int, like: Any) -> Any:
    import io

    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(io.BufferedWriter(raw, buffer_size=1 << 16), encoding=like.encoding,
                            errors=like.errors, line_buffering=True)


def _watch_lifeline(lifeline: Any) -> None:
    def watch() -> None:
        try:
            lifeline.recv()
        except (EOFError, OSError):
            pass
        os._exit(3)

    threading.Thread(target=watch, name="meshsim-lifeline", daemon=True).start()


def worker_main(spec: WorkerSpec, conn: Any, lifeline: Any) -> None:
    if spec.flight_recorder:
        from . import flight

        flight.block_dump_signal()  # before any thread starts
    _die_with_parent(own_session=spec.script)
    _watch_lifeline(lifeline)
    _name_process(f"meshsim-r{spec.rank}")
    if not spec.script:  # a script's warnings are its own, shown as under torchrun; in a plan they are torch's
        warnings.simplefilter("ignore")  # deprecation chatter from 8 ranks, which would bury the report
    from ..spec.topology import Topology

    topology = Topology(spec.hosts, spec.devices_per_host)
    os.environ.update(topology.env(spec.rank, spec.port))
    # A simulated cluster lives on this machine: never listen beyond loopback, whatever the user's shell says.
    os.environ.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    if uses_nccl(spec.backend):
        os.environ["CUDA_VISIBLE_DEVICES"] = topology.gpu_slice(spec.rank)
    _capture_output(spec.output_file, spec.error_file)
    stacks = open(spec.stack_file, "w")
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
    if spec.flight_recorder:
        flight.arm(spec.flight_recorder, spec.rank)
    if spec.script:
        serve_script(spec, conn)
        return
    measure = None
    if spec.coverage_file:
        from .coverage import start_in_rank

        measure = start_in_rank(spec.coverage_file)
    send = sender(conn)
    try:
        session = RankSession.join(spec.backend, spec.rank, topology.world, send,
                                   store=("127.0.0.1", spec.port, spec.prefix), timeout_s=spec.start_timeout_s,
                                   hold_s=HOLD_S)
    except CompatError as exc:  # a patch that does not fit this torch: its one line is the whole story
        conn.send(JoinFailed(str(exc), incompatible=True))
        os._exit(4)
    except Exception as exc:  # could not join the world: tell the controller why, then leave
        conn.send(JoinFailed(f"{type(exc).__name__}: {exc}"))
        os._exit(4)
    if spec.backend == "gloo":
        from .transports import Transports, install

        session.transports = Transports(spec.rank)
        install(session.transports)
        session.progress.hold_creations = True  # the transports send what is held before each connect
    conn.send(Ready(os.getpid()))
    serve(session, conn, send, measure)


def serve(session: RankSession, conn: Any, send: Callable[[Any], None], measure: Any = None) -> None:
    """The worker's command loop: one command at a time from the controller, until Stop or the pipe closes.
    `measure`: a running coverage.py measurement, saved after every plan (a rank killed for a hang keeps what
    it reached up to that plan)."""

    def stop(message: Stop) -> None:
        session.dist.destroy_process_group()
        if measure is not None:
            measure.save()
        os._exit(0)

    def run_plan(message: RunPlan) -> None:
        done = session.run_plan(message.plan, message.deadline)
        if measure is not None:
            measure.save()
        session.progress.send_result(done)

    handlers: dict[type, Callable[[Any], Any]] = {
        RunPlan: run_plan,
        RunFunction: lambda m: send(session.run_function(m.payload, m.deadline)),
        Teardown: lambda m: session.teardown(m.next_group_count, m.forget),
        Stop: stop,
    }
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(3)
        dispatch(message, handlers)


def fresh_start_method() -> None:
    """multiprocessing's start method as a new process has it (the platform's default), as in torchrun's ranks: a
    rank started by the forkserver inherits the forkserver's method, and a script's DataLoader(num_workers > 0)
    then started its workers through a forkserver of its own, which ran the whole script again in each."""
    import multiprocessing

    multiprocessing.set_start_method(None, force=True)


TORCH_DEFAULT_SEED = 67280421310721  # c10's default_rng_seed_val: a new process's CPU seed before torch 2.13


def fresh_random_state() -> None:
    """The random state of a new process, as torchrun's ranks have it: a rank forked from the forkserver would
    otherwise share its generators' state with every other rank (Python's own `random` reseeds itself at fork).
    A torch that seeds each new process with a constant gets that constant; one that seeds it at random (2.13
    does) gets a fresh random seed, as does numpy's global generator."""
    import torch

    if torch.initial_seed() == TORCH_DEFAULT_SEED:
        torch.manual_seed(TORCH_DEFAULT_SEED)
    else:
        torch.default_generator.seed()  # the CPU's only: a new process's CUDA generators start from the constant
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def serve_script(spec: WorkerSpec, conn: Any) -> None:
    """A bare rank: torchrun's environment (the controller's store stands for torchrun's agent store), the
    progress hooks, simulated GPUs if asked, and then one script run as __main__."""
    import torch.distributed.distributed_c10d as c10d

    from ..compat.follow import install
    from ..compat.progress import Progress

    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # env:// connects to the controller's store as torchrun's
    fresh_random_state()
    fresh_start_method()
    progress = Progress(sender(conn), hold_s=HOLD_S, hold_scripts=True)
    _flush_before_exit(progress)
    try:
        if spec.simulated_gpus:
            from ..compat import simgpu

            simgpu.install(spec.gpus_per_host or spec.devices_per_host, spec.gpu)
        install(progress)
    except CompatError as exc:  # before the script runs: never a TypeError inside the user's code
        conn.send(JoinFailed(str(exc), incompatible=True))
        os._exit(4)
    conn.send(Ready(os.getpid()))

    def run(message: RunScript) -> None:
        c10d.default_pg_timeout = timedelta(seconds=torch_wait(message.deadline))
        if message.hosts:
            from .host import become

            become(message.hosts[spec.rank])
        progress.emit(FunctionBegun("script"))
        progress.send_result(run_script(message))
        dispatch(conn.recv(), {Stop: lambda m: os._exit(0)})

    try:
        dispatch(conn.recv(), {RunScript: run, Stop: lambda m: os._exit(0)})
    except (EOFError, OSError):
        os._exit(3)
    os._exit(0)


def _flush_before_exit(progress: Any) -> None:
    """A script that ends its process with os._exit (as launchers' children do on a fatal error) is heard to its
    last call first: its rank holds its progress for a moment (meshsim.compat.progress)."""
    exit_now, rank_pid = os._exit, os.getpid()

    def flushed_exit(code: int) -> NoReturn:
        # (a forked child, a DataLoader's worker, ends with os._exit too: what it inherited held is the rank's)
        if os.getpid() == rank_pid:
            try:
                progress.flush(timeout=1.0)
            except OSError:  # the controller has gone: nobody to tell
                pass
        exit_now(code)

    os._exit = flushed_exit  # type: ignore[assignment]


# What a script left behind (its globals, or the exception whose traceback holds them) lives until the rank's
# os._exit, as it would until a real process ends. Freeing it when the script returns destroyed a DDP model's
# Reducer, and with it a gloo group, while holding the GIL; the group's destructor joins gloo's worker thread,
# which may still need the GIL to drop its last work: a deadlock (torch's bug class pytorch#56297), seen here
# in about one launch in twelve under load.
_SCRIPT_REMAINS: list = []


def run_script(message: RunScript) -> ScriptDone:
    """The script as __main__, with its directory first on sys.path and its arguments in sys.argv, as python does."""
    import runpy

    import torch.distributed.distributed_c10d as c10d

    code, text, error, site = 0, "", "", ""
    sys.argv = [message.target] + list(message.argv)
    try:
        if message.is_module:
            if message.launch_dir:
                sys.path.insert(0, message.launch_dir)  # as `python -m` puts its working directory first
            _SCRIPT_REMAINS.append(runpy.run_module(message.target, run_name="__main__", alter_sys=True))
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(message.target)))
            _SCRIPT_REMAINS.append(runpy.run_path(message.target, run_name="__main__"))
    except SystemExit as exc:
        _SCRIPT_REMAINS.append(exc)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # as python prints sys.exit("why") on its way out
            error, site = f"sys.exit({exc.code!r})", _script_site(exc, message)
    except BaseException as exc:  # noqa: BLE001 -- the script's failure is the result
        _SCRIPT_REMAINS.append(exc)
        code, text = 1, "".join(traceback.format_exception(exc))
        error, site = exception_line(exc), _script_site(exc, message)
        sys.stderr.write(text)
    sys.stdout.flush()
    sys.stderr.flush()
    return ScriptDone(code, text, c10d._world.group_count, error, site)


def exception_line(exc: BaseException) -> str:
    """The exception's own "Type: message" line, as Python prints it last in a traceback: its message's first
    line (a message of several lines, a note or a chained exception would follow it)."""
    for part in traceback.format_exception_only(exc):
        if not part[:1].isspace():  # (a SyntaxError prints the offending line and a caret first)
            return part.splitlines()[0]
    return type(exc).__name__


def _script_site(exc: BaseException, message: RunScript) -> str:
    """The innermost frame of the script (or the module's file) that the exception passed: "train.py:42"."""
    script = message.target
    if message.is_module:
        import importlib.util

        try:
            script = getattr(importlib.util.find_spec(message.target), "origin", None) or ""
        except (ImportError, ValueError):
            return ""
    places = [(frame.filename, frame.lineno) for frame in traceback.extract_tb(exc.__traceback__)]
    if isinstance(exc, SyntaxError):  # the script did not compile: the line is the error's own
        places.append((exc.filename or "", exc.lineno))
    for filename, line in reversed(places):
        if filename == script:
            return f"{os.path.basename(filename)}:{line}"
    return ""


class RankSession:
    """The torch side of a rank: the default group, the progress hooks, the plan interpreter, the teardown."""

    def __init__(self, rank: int, world: int, device_type: str, store: Any, send: Callable[[Any], None],
                 interpreter: Any = None, transports: Any = None, hold_s: float | None = None):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        from ..compat.follow import install
        from ..compat.memo import install as remember_layouts
        from ..compat.progress import Progress
        from .interpreter import Interpreter

        self.dist, self.c10d, self.store = dist, c10d, store
        self.baseline = set(c10d._world.pg_map)
        self.progress = Progress(send, hold_s)
        install(self.progress)
        remember_layouts()
        self.interpreter = (interpreter or Interpreter)(rank, world, device_type, self.progress)
        self.transports = transports  # gloo backends kept across plans (meshsim.run.transports), where asked

    @classmethod
    def join(cls, backend: str, rank: int, world: int, send: Callable[[Any], None],
             store: tuple[str, int, str] | None = None, timeout_s: float = 120.0,
             hold_s: float | None = None) -> RankSession:
        """Join the world: on the controller's store (host, port, prefix), or on torchrun's (store None).
        hold_s: how long a plan's progress may be held (meshsim.compat.progress; None: sent at once)."""
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        torch.set_num_threads(1)
        timeout = timedelta(seconds=torch_wait(timeout_s))
        c10d.default_pg_timeout = timeout
        device_type = platform_for(backend).device
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        client: Any
        if store is not None:
            host, port, prefix = store
            client = dist.PrefixStore(prefix, dist.TCPStore(host, port, is_master=False, timeout=timeout))
            dist.init_process_group(backend, store=client, rank=rank, world_size=world, timeout=timeout)
        else:
            dist.init_process_group(backend, timeout=timeout)
            client = c10d._get_default_store()
        dist.barrier()  # the first collective pays for lazy set-up; pay it before the first plan
        return cls(rank, world, device_type, client, send, hold_s=hold_s)

    def bound_waits(self, deadline_s: float) -> None:
        """Make torch's own waits end shortly after meshsim's deadline (subgroups default to 30 min). Runs of the
        same deadline find them bound already."""
        if getattr(self, "_bound_to", None) == deadline_s:
            return
        self._bound_to = deadline_s
        timeout = timedelta(seconds=torch_wait(deadline_s))
        self.c10d.default_pg_timeout = timeout
        self.c10d.default_pg_nccl_timeout = timeout
        self.store.set_timeout(timeout)
        try:
            self.c10d._set_pg_timeout(timeout)
        except Exception:
            pass

    def run_plan(self, plan: Any, deadline_s: float) -> PlanDone:
        self.bound_waits(deadline_s)
        self.progress.in_plan = True
        if self.transports is not None:
            self.transports.begin()  # a plan's groups: a user function's make their own
        try:
            observations, end, end_step = self.interpreter.run(plan)
        finally:
            self.progress.end_plan()
            if self.transports is not None:
                self.transports.on = False
        kept = self.transports.report() if self.transports is not None else ()
        return PlanDone(observations, end, end_step, self.c10d._world.group_count, kept)

    def run_function(self, payload: bytes, deadline_s: float) -> FunctionDone:
        import dill

        self.bound_waits(deadline_s)
        self.progress.emit(FunctionBegun("user function"))
        try:
            fn, args, kwargs = dill.loads(payload)
            ok, value = True, fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 -- the user's exception is the result
            ok, value = False, (exc, "".join(traceback.format_exception(exc)))
        return FunctionDone(ok, _dumps(value), self.c10d._world.group_count)

    def teardown(self, next_group_count: int, forget: Any = None) -> None:
        """Destroy what the last run made (every rank has finished it) and align the group counters; drop the kept
        transports the controller says to (`forget`, None: all)."""
        self.progress.emit(StepBegun(-1, "teardown", None, time.time()))
        self.interpreter.release(self.baseline, next_group_count)
        if self.transports is not None:
            self.transports.forget(forget)


def _dumps(value: Any) -> bytes:
    import dill

    try:
        return dill.dumps(value)
    except Exception:
        return dill.dumps(repr(value))
