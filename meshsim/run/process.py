"""The process executor: a controller that hosts the store on loopback and owns forked worker processes, one
per simulated device, started once and reused for many plans and functions under a deadline each."""

from __future__ import annotations

import atexit
import os
import selectors
import socket
import tempfile
import time
import weakref
from datetime import timedelta
from typing import Any, Callable

from .. import deadlines
from ..spec.platform import CPU, Platform
from ..outcome import PASS
from ..spec.topology import Topology
from ..wire import DIED, FINISHED, RAISED, STUCK, FunctionDone, PlanDone, RankDied, ScriptDone, Teardown
from .generation import PRELOAD, ClusterError, Generation, SetupError
from .rank import WorkerSpec, worker_main
from .reaper import Reaper
from .record import RankState, RunRecord

BACKENDS = ("gloo", "nccl", "cpu:gloo,cuda:nccl", "auto")
MAX_PROCESS_WORLD = 64  # a process per rank: beyond this, 2 cores and gloo's full-mesh connects crawl
_open_clusters: "weakref.WeakSet[Cluster]" = weakref.WeakSet()


def resolve_backend(backend: str, world: int) -> str:
    """'auto' -> nccl when there is a GPU for every rank, else gloo; nccl without enough GPUs is an error."""
    if backend not in BACKENDS:
        raise ClusterError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "gloo":
        return backend
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if gpus >= world else "gloo"
    if gpus < world:
        raise ClusterError(f"backend {backend} runs one rank per GPU: {world} ranks need {world} GPUs, "
                           f"{gpus} visible")
    return backend


class Cluster:
    """H simulated hosts x D devices of real torch.distributed ranks, started once, reused for many plans.

    >>> with Cluster(Topology(hosts=2, devices_per_host=4)) as cluster:
    ...     result = cluster.run(plan)
    """

    tier = "process"
    platform = CPU
    max_world = MAX_PROCESS_WORLD
    worker_target = staticmethod(worker_main)

    def __init__(self, topology: Topology, backend: str = "gloo", deadline: float = deadlines.PLAN_S,
                 start_timeout: float = deadlines.START_S, setup: Callable | str | None = None,
                 script: bool = False, simulated_gpus: bool = False,
                 echo: Callable[[int, str], None] | None = None, coverage_dir: str | None = None):
        if topology.world > self.max_world:
            raise ClusterError(f"{topology} is {topology.world} ranks; the {self.tier} tier runs at most "
                               f"{self.max_world} (larger worlds: --tier thread up to 1,024, fake up to 16,384 "
                               "and more, model for layouts alone)")
        self.topology = topology
        self.setup = setup  # run on every rank of every generation (a callable, or "module:function")
        self.coverage_dir = coverage_dir  # measure torch's DeviceMesh code in the ranks (meshsim.torch_coverage)
        self.backend = resolve_backend(backend, topology.world)
        self.platform = Platform("cuda", True) if self.backend == "nccl" else CPU  # the model needs to know
        self.deadline = deadlines.checked(deadline)
        self.start_timeout = deadlines.checked(start_timeout, "start timeout")
        self.broken: SetupError | None = None  # a setup that failed once fails every generation: stop trying
        self.generation: Generation | None = None
        self.generations_started = 0
        self._store: Any = None
        self._kept_keys: set[str] | None = None  # store keys of the running generation itself (not of plans)
        self._port = 0
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._ctx: Any = None
        self._reaper: Reaper | None = None
        self._in_setup = False
        self.script = script  # bare ranks that run one script each (meshsim launch): nothing pre-initialised
        self.simulated_gpus = simulated_gpus
        self.echo = echo  # called with (rank, new output) while a run goes on

    # ------------------------------------------------------------------ life cycle

    @property
    def world(self) -> int:
        return self.topology.world

    @property
    def port(self) -> int:
        return self._port

    def __enter__(self) -> "Cluster":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> "Cluster":
        if self._store is not None:
            return self
        import torch.distributed as dist
        import torch.multiprocessing as mp

        self._tmp = tempfile.TemporaryDirectory(prefix="meshsim-")
        # The store listens on loopback only: TCPStore binds every interface unless handed a socket.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        self._port = listener.getsockname()[1]
        self._store = dist.TCPStore("127.0.0.1", self._port, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=self.start_timeout),
                                    master_listen_fd=listener.fileno())
        listener.detach()  # the store owns the socket now
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(PRELOAD)
        self._reaper = Reaper()
        _open_clusters.add(self)
        try:
            self._new_generation()
        except BaseException:
            self.close()
            raise
        return self

    def _worker_specs(self, number: int) -> list[WorkerSpec]:
        return [
            WorkerSpec(rank, self.topology.hosts, self.topology.devices_per_host, self.port, f"g{number}/",
                       self.backend, os.path.join(self._tmp.name, f"stacks-{number}-{rank}"),
                       os.path.join(self._tmp.name, f"output-{number}-{rank}"), self.start_timeout, self.script,
                       self.simulated_gpus,
                       os.path.join(self.coverage_dir, "rank") if self.coverage_dir else None)
            for rank in range(self.world)
        ]

    def _after_start(self, generation: Generation) -> None:
        """What a tier reads from its workers once they are ready."""

    def _new_generation(self) -> Generation:
        self.generations_started += 1
        number = self.generations_started
        generation = Generation(number)
        self.generation = generation
        generation.start(self._ctx, self._worker_specs(number), self.start_timeout, self._reaper,
                         target=self.worker_target)
        self._after_start(generation)
        if self.setup is not None:
            self._run_setup()
        self._kept_keys = self._store_keys()  # the world's own keys; what later plans add is theirs alone
        return generation

    def _store_keys(self) -> set[str] | None:
        lister = getattr(self._store, "list_keys", None)
        return set(lister()) if lister is not None else None

    def _forget_keys(self, keep: Callable[[str], bool]) -> None:
        """Delete the store keys of groups that no longer exist. Every new_group leaves rendezvous keys in the
        store, which lives in this process: a long sweep would otherwise grow it by kilobytes a plan."""
        keys = self._store_keys()
        for key in keys or ():
            if not keep(key):
                self._store.delete_key(key)

    def _run_setup(self) -> None:
        from ..functions import run_function

        target = self.setup if callable(self.setup) else _call_by_name
        args = () if callable(self.setup) else (self.setup,)
        self._in_setup = True
        try:
            run = run_function(self, target, args, {}, self.start_timeout)
        finally:
            self._in_setup = False
        if run.outcome != PASS:
            self.restart()
            name = getattr(self.setup, "__name__", self.setup)
            self.broken = SetupError(f"setup {name} did not pass on the ranks ({run.outcome}): "
                                     + run.summary().splitlines()[-1].strip())
            raise self.broken

    def _ensure_generation(self) -> Generation:
        if self.broken is not None:
            raise self.broken
        if self._store is None:
            raise ClusterError("the cluster is not started (use `with Cluster(...)` or .start())")
        if self.generation is not None and not all(w.alive for w in self.generation.workers):
            self.restart()  # a rank died between plans (killed from outside): start afresh
        if self.generation is None:
            return self._new_generation()
        return self.generation

    def restart(self) -> None:
        """Kill the workers; fresh ones start for the next plan."""
        if self.generation is not None:
            self.generation.kill()
            if self._store is not None:
                prefix = f"g{self.generation.number}/"
                self._forget_keys(lambda key: not key.startswith(prefix))
            self.generation = None
            self._kept_keys = None

    def close(self) -> None:
        if self.generation is not None:
            self.generation.stop()
            self.generation = None
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
        self._store = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        _open_clusters.discard(self)

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.generation.workers] if self.generation else []

    # ------------------------------------------------------------------ running

    def run(self, plan: Any, deadline: float | None = None, strict: bool = False) -> Any:
        """Run a plan on every rank and judge it against the model (meshsim.check). Returns a Result."""
        from ..check import check

        return check(self, plan, self.deadline if deadline is None else deadline, strict=strict)

    def execute(self, work: Any, meanwhile: Callable[[], Any] | None = None) -> RunRecord:
        """Send one piece of work to every rank and follow it to its end (the Executor protocol)."""
        generation = self._ensure_generation()
        started = time.monotonic()
        self._send(generation, work)
        if meanwhile is not None:
            meanwhile()  # the model predicts while the ranks work
        record = self._follow(generation, started, work.deadline)
        for worker in generation.workers:
            record.states[worker.rank].output = worker.new_output()
        if record.timed_out or record.died:
            record.stacks = self._stacks(generation, record.stuck)
            self.restart()
            if not self._in_setup:  # a failed setup is final: no fresh generation would do better
                try:
                    self._new_generation()  # fresh ranks now, so the cluster is ready when the caller gets the result
                except SetupError:
                    raise
                except ClusterError:
                    self.generation = None  # the next run tries again and reports why it cannot start
        else:
            self._between_runs(generation, record)
        return record

    def _send(self, generation: Generation, work: Any) -> None:
        generation.send(work)

    def _between_runs(self, generation: Generation, record: RunRecord) -> None:
        """Destroy what the run made, on every rank, before the next (a script's ranks are done for good)."""
        if not self.script:
            generation.send(Teardown(max(s.group_count for s in record.states) + 1))
            kept = self._kept_keys
            if kept is not None:  # every rank has finished the plan: no group of it is still connecting
                self._forget_keys(kept.__contains__)

    def _follow(self, generation: Generation, started: float, deadline: float) -> RunRecord:
        """Read every rank's progress until all have answered, one died (plus a grace), or time ran out.

        One selector, registered for the pending ranks' pipes and process sentinels: a plan sends hundreds of
        progress messages, and rebuilding the wait set for each of them cost a fifth of a core.
        """
        states = [RankState(w.rank) for w in generation.workers]
        pending = {w.rank for w in generation.workers}
        hard = started + deadline
        first_death: float | None = None
        with selectors.DefaultSelector() as selector:
            for worker in generation.workers:
                selector.register(worker.conn, selectors.EVENT_READ, (worker, False))
                selector.register(worker.process.sentinel, selectors.EVENT_READ, (worker, True))
            while pending:
                limit = hard if first_death is None else min(hard, first_death + deadlines.DEATH_GRACE_S)
                left = limit - time.monotonic()
                if left <= 0:
                    break
                if self.echo is not None:
                    self._echo(generation)
                for key, _ in selector.select(timeout=left if self.echo is None else min(left, 0.2)):
                    worker, is_sentinel = key.data
                    if worker.rank not in pending:
                        continue
                    status = self._drain(worker, states[worker.rank])
                    if status == "result":
                        pending.discard(worker.rank)
                        if self.script and states[worker.rank].end == RAISED:
                            first_death = first_death or time.monotonic()  # as torchrun: one fails, all stop
                    elif status == "eof" or is_sentinel:
                        worker.process.join(0.5)
                        self._drain(worker, states[worker.rank])
                        state = states[worker.rank]
                        state.end, state.exitcode = DIED, worker.process.exitcode
                        pending.discard(worker.rank)
                        first_death = first_death or time.monotonic()
                    if worker.rank not in pending:
                        selector.unregister(worker.conn)
                        selector.unregister(worker.process.sentinel)
        if self.echo is not None:
            self._echo(generation)
        for rank in pending:
            states[rank].end = STUCK
        return RunRecord(self.world, deadline, states, time.monotonic() - started, bool(pending))

    def _stacks(self, generation: Generation, ranks: list[int]) -> dict[int, str]:
        return generation.stacks(ranks)

    def _echo(self, generation: Generation) -> None:
        for worker in generation.workers:
            text = worker.new_output(limit=None)
            if text:
                self.echo(worker.rank, text)

    @staticmethod
    def _drain(worker: Any, state: RankState) -> str:
        """Read what the worker sent: 'result' once its result is in, 'eof' if it is gone, else 'more'."""
        try:
            while worker.readable():
                if absorb(state, worker.conn.recv()):
                    return "result"
        except (EOFError, OSError):
            return "eof"
        return "more"

    def run_fn(self, fn: Callable, *args: Any, deadline: float | None = None, **kwargs: Any) -> Any:
        """Run fn(*args, **kwargs) on every rank (closures and lambdas too); see meshsim.functions."""
        from ..functions import run_function

        return run_function(self, fn, args, kwargs, deadline)


def absorb(state: RankState, message: Any) -> bool:
    """Take one message of a rank into its state; True once it is how the rank ended."""
    if isinstance(message, RankDied):  # a rank that is a thread or a loop iteration "died" (exit/kill fault)
        state.end, state.exitcode = DIED, message.exitcode
        return True
    if isinstance(message, PlanDone):
        state.observations, state.end, state.end_step = message.observations, message.end, message.end_step
    elif isinstance(message, FunctionDone):
        state.value, state.end = message.value, FINISHED if message.ok else RAISED
    elif isinstance(message, ScriptDone):
        state.value, state.end = message, FINISHED if message.exit_code == 0 else RAISED
    else:
        state.on_event(message)  # progress; any other kind is refused there
        return False
    state.group_count, state.done = message.group_count, True
    return True


def _call_by_name(target: str) -> None:
    """Import "package.module:function" on a rank and call it."""
    import importlib

    module, _, name = target.partition(":")
    if not name:
        raise ValueError(f"setup must look like module:function, got {target!r}")
    getattr(importlib.import_module(module), name)()


def close_all(kill: bool = False) -> None:
    """Close every cluster of this process (at exit; with kill=True, when a signal ends the run: no goodbyes)."""
    for cluster in list(_open_clusters):
        try:
            if kill:
                cluster.restart()
            cluster.close()
        except Exception:
            pass


atexit.register(close_all)
