"""A worker process: one simulated rank, started once and reused for many plans.

It dies with the controller (PR_SET_PDEATHSIG, and a lifeline pipe whose end-of-file it watches from a
thread, which works even while the main thread is stuck inside C++), dumps its Python stacks on SIGUSR1,
and bounds every torch wait by the plan's deadline.
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
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

STACK_SIGNAL = signal.SIGUSR1
TORCH_MARGIN_S = 15.0  # torch's own timeouts fire this long after meshsim's deadline


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
    timeout_s: float


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() == 1:  # the parent is already gone
        os._exit(3)


def _name_process(name: str) -> None:
    """Show up as meshsim-rN in ps/top (PR_SET_NAME)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(15, ctypes.c_char_p(name.encode()[:15]))
        except OSError:
            pass


def _capture_output(path: str) -> None:
    """Send this rank's stdout and stderr (Python's and C++'s) to its own file, for the report."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _watch_lifeline(lifeline: Any) -> None:
    def watch() -> None:
        try:
            lifeline.recv()
        except (EOFError, OSError):
            pass
        os._exit(3)

    threading.Thread(target=watch, name="meshsim-lifeline", daemon=True).start()


def worker_main(spec: WorkerSpec, conn: Any, lifeline: Any) -> None:
    _die_with_parent()
    _watch_lifeline(lifeline)
    _name_process(f"meshsim-r{spec.rank}")
    warnings.simplefilter("ignore")  # torch's deprecation chatter from 8 ranks would bury the report
    from ..topology import Topology

    topology = Topology(spec.hosts, spec.devices_per_host)
    os.environ.update(topology.env(spec.rank, spec.port))
    if "nccl" in spec.backend:
        os.environ["CUDA_VISIBLE_DEVICES"] = topology.gpu_slice(spec.rank)
    _capture_output(spec.output_file)
    stacks = open(spec.stack_file, "w")
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
    try:
        rank = Rank(spec, conn)
    except Exception as exc:  # could not join the world: tell the controller why, then leave
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        os._exit(4)
    conn.send(("ready", os.getpid()))
    rank.serve()


class Rank:
    """The torch side of a worker: the default group, and the command loop."""

    def __init__(self, spec: WorkerSpec, conn: Any):
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        from .execute import Executor
        from .progress import Progress, install

        torch.set_num_threads(1)
        self.spec = spec
        self.conn = conn
        self.dist = dist
        self.c10d = c10d
        store = dist.TCPStore("127.0.0.1", spec.port, is_master=False, timeout=timedelta(seconds=spec.timeout_s))
        self.store = dist.PrefixStore(spec.prefix, store)
        world = spec.hosts * spec.devices_per_host
        device_type = "cuda" if "nccl" in spec.backend else "cpu"
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(spec.backend, store=self.store, rank=spec.rank, world_size=world,
                                timeout=timedelta(seconds=spec.timeout_s))
        dist.barrier()  # the first collective pays for lazy set-up; pay it before the first plan
        self.baseline = set(c10d._world.pg_map)
        self.progress = Progress(self._send)
        install(self.progress)
        self.executor = Executor(spec.rank, world, device_type, self.progress)

    def _send(self, event: tuple) -> None:
        self.conn.send(event)

    def serve(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                os._exit(3)
            kind = message[0]
            if kind == "plan":
                self.bound_waits(message[2])
                observations, end, end_step = self.executor.run(message[1])
                self.conn.send(("result", observations, end, end_step, self.c10d._world.group_count))
            elif kind == "fn":
                self.bound_waits(message[2])
                self.conn.send(self.run_function(message[1]) + (self.c10d._world.group_count,))
            elif kind == "teardown":
                self.teardown(message[1])
            elif kind == "stop":
                self.dist.destroy_process_group()
                os._exit(0)

    def bound_waits(self, deadline_s: float) -> None:
        """Make torch's own waits end shortly after meshsim's deadline (subgroups default to 30 min)."""
        timeout = timedelta(seconds=deadline_s + TORCH_MARGIN_S)
        self.c10d.default_pg_timeout = timeout
        self.c10d.default_pg_nccl_timeout = timeout
        self.store.set_timeout(timeout)
        try:
            self.c10d._set_pg_timeout(timeout)
        except Exception:
            pass

    def run_function(self, payload: bytes) -> tuple:
        import dill

        self.progress.emit(("fn", "user function"))
        try:
            fn, args, kwargs = dill.loads(payload)
            value = fn(*args, **kwargs)
            return ("fn_result", True, _dumps(value))
        except BaseException as exc:  # noqa: BLE001 -- the user's exception is the result
            text = "".join(traceback.format_exception(exc))
            return ("fn_result", False, _dumps((exc, text)))

    def teardown(self, next_group_count: int) -> None:
        self.progress.emit(("step", -1, "teardown", None, time.time()))
        self.executor.release(self.baseline, next_group_count)


def _dumps(value: Any) -> bytes:
    import dill

    try:
        return dill.dumps(value)
    except Exception:
        return dill.dumps(repr(value))
