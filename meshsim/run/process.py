"""The process executor: forked worker processes, one per simulated device, started once and reused for many
plans and functions under a deadline each (gloo on the CPU, or NCCL with a GPU per rank)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ..core import deadlines
from ..core.errors import ClusterError, SetupError
from ..core.outcome import outcome_of
from ..core.record import RankState, RunRecord, RunStatus
from ..core.wire import FINISHED, STUCK, RunFunction, RunPlan, RunScript, Teardown
from ..spec.platform import BACKENDS, platform_for
from ..spec.tiers import TIERS
from ..spec.topology import Topology
from .follow import Hosted, Still, follow
from .generation import Generation
from .pool import Pooled, WorkerPool
from .rank import WorkerSpec, worker_main
from .still import Stillness, available
from .transports import Keeper

Work = RunPlan | RunFunction | RunScript


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


class ProcessExecutor(Pooled):
    """H simulated hosts x D devices of real torch.distributed ranks, each a forked process.

    script=True makes bare ranks for `meshsim launch` (nothing pre-initialised; a RunScript each); `setup` runs on
    every rank of every generation (a callable, or "module:function"); `echo(rank, text, stream)` sees what ranks
    print while a run goes on: stream is "output" (stdout and stderr as written), or with split_streams=True
    "stdout" and "stderr" apart. gpus_per_host: the simulated GPUs each host shows (default one a rank); gpu: the
    card each simulated GPU is (meshsim.compat.simgpu.gpus; default an H100 80GB).
    """

    tier = "process"
    capabilities = TIERS["process"]
    watch: Callable[[RunStatus], None] | None = None  # told how far each run is (a progress bar)

    def __init__(self, topology: Topology, backend: str = "gloo", deadline: float | None = None,
                 start_timeout: float | None = None, setup: Callable | str | None = None,
                 script: bool = False, simulated_gpus: bool = False,
                 echo: Callable[[int, str, str], None] | None = None, coverage_dir: str | None = None,
                 flight_recorder: str | None = None, gpus_per_host: int | None = None, split_streams: bool = False,
                 gpu: str | None = None):
        if topology.world > self.capabilities.max_world:
            raise ClusterError(f"{topology} is {topology.world} ranks; the process tier runs at most "
                               f"{self.capabilities.max_world} (larger worlds: --tier thread up to "
                               f"{TIERS['thread'].max_world:,}, fake to {TIERS['fake'].max_world:,}, model for "
                               "layouts alone)")
        self.topology = topology
        self.backend = resolve_backend(backend, topology.world)
        self.platform = platform_for(self.backend)  # the model needs to know
        self.deadline, self.start_timeout = deadlines.for_tier(self.tier, topology.world, deadline, start_timeout)
        self.setup = setup
        self.coverage_dir = coverage_dir  # measure torch's code in the ranks (meshsim.sweep.coverage)
        self.script = script
        self.simulated_gpus = simulated_gpus
        self.echo = echo
        self.gpus_per_host = gpus_per_host
        if gpu is not None:
            from ..compat.simgpu.gpus import gpu_of

            gpu_of(gpu)  # a card meshsim does not know is one line (GPUError), before any rank starts
        self.gpu = gpu
        self.split_streams = split_streams
        self.flight_recorder = flight_recorder  # where a hung run's Flight Recorder dumps go (meshsim.run.flight)
        self.broken: SetupError | None = None  # a setup that failed once fails every generation: stop trying
        self.pool = WorkerPool(self._specs, worker_main, self.start_timeout, after_start=self._after_start)
        self.keeper = Keeper(0)

    # ------------------------------------------------------------------ life cycle

    @property
    def world(self) -> int:
        return self.topology.world

    @property
    def port(self) -> int:
        return self.pool.port

    @property
    def generations_started(self) -> int:
        return self.pool.generations_started

    def prepare_spare(self) -> None:
        """Start the generation that replaces the ranks after a hang, now, in the background (meshsim.run.pool)."""
        self.pool.prepare_spare()

    def renew(self) -> None:
        """Kill the workers and start fresh ones on a new store, as torchrun's agent restarts a failed worker group:
        torch's env:// rendezvous keeps no attempt apart from the last in the agent's store (torch 2.13 expects a
        new store for every attempt), and a script's ranks rendezvous on the store itself."""
        self.pool.restart()
        self.pool.close()
        self.pool.start()

    def _specs(self, number: int, tmp: str, port: int) -> list[WorkerSpec]:
        return [
            WorkerSpec(rank, self.topology.hosts, self.topology.devices_per_host, port, f"g{number}/",
                       self.backend, os.path.join(tmp, f"stacks-{number}-{rank}"),
                       os.path.join(tmp, f"output-{number}-{rank}"), self.start_timeout, self.script,
                       self.simulated_gpus,
                       os.path.join(self.coverage_dir, "rank") if self.coverage_dir else None,
                       self.flight_recorder, self.gpus_per_host,
                       os.path.join(tmp, f"errors-{number}-{rank}") if self.split_streams else None, self.gpu)
            for rank in range(self.world)
        ]

    def _after_start(self, generation: Generation) -> None:
        if self.setup is not None:
            self._run_setup(generation)

    def _run_setup(self, generation: Generation) -> None:
        """The setup function on every rank of a fresh generation; one that fails is final."""
        from multiprocess.reduction import ForkingPickler

        target = self.setup if callable(self.setup) else _call_by_name
        args = () if callable(self.setup) else (self.setup,)
        payload = bytes(ForkingPickler.dumps((target, args, {})))
        record = self._run(generation, RunFunction(payload, self.start_timeout))
        if not record.timed_out and not record.died and all(s.end == FINISHED for s in record.states):
            self._after_run(generation, record)
            return
        self.pool.restart()
        name = getattr(self.setup, "__name__", self.setup)
        how = outcome_of((s.end for s in record.states), record.timed_out)
        self.broken = SetupError(f"setup {name} did not pass on the ranks ({how}): {_first_failure(record)}")
        raise self.broken

    # ------------------------------------------------------------------ running

    def execute(self, work: Work, meanwhile: Callable[[], Any] | None = None,
                if_hangs: Callable[[], float | None] | None = None) -> RunRecord:
        """Send one piece of work to every rank and follow it to its end (the Executor protocol)."""
        if self.broken is not None:
            raise self.broken
        generation = self.pool.current()
        started = time.monotonic()
        generation.send(work)
        if meanwhile is not None:
            meanwhile()  # the model predicts while the ranks work
        still, deadline = None, work.deadline
        hang_wait = if_hangs() if if_hangs is not None and isinstance(work, RunPlan) else None
        if hang_wait is not None:
            deadline = min(deadline, hang_wait)
            self.pool.prepare_spare()  # the ranks that replace a hung generation start while it hangs
            if available():
                still = Still(Stillness(), {w.rank: w.pid for w in generation.workers if w.pid})
        record = self._follow(generation, started, deadline, still)
        if record.timed_out or record.died:
            record.stacks = generation.stacks(record.stuck)
            if self.flight_recorder is not None:
                self._dump_flight_records(generation, record)
            if record.stopped == "interrupted":
                record.notes.append("interrupted (Ctrl-C): the diagnosis is of the run as it stood")
            if record.stopped == "interrupted" or self.script:
                self.pool.restart()  # no fresh ranks: the user wants out, or a script's ranks serve one run only
            else:
                self.pool.refresh()
        else:
            self._after_run(generation, record)
        return record

    def _dump_flight_records(self, generation: Generation, record: RunRecord) -> None:
        from . import flight

        assert self.flight_recorder is not None
        live = {w.rank: w.pid for w in generation.workers if w.alive and w.pid}
        came = flight.collect(self.flight_recorder, live)
        record.notes.append(f"Flight Recorder dumps of ranks {came} in {self.flight_recorder} (torch's format: "
                            f"`meshsim replay {self.flight_recorder}` or torch's analyzer read them)")

    def _run(self, generation: Generation, work: Work) -> RunRecord:
        generation.send(work)
        return self._follow(generation, time.monotonic(), work.deadline)

    def _follow(self, generation: Generation, started: float, deadline: float, still: Still | None = None
                ) -> RunRecord:
        states = [RankState(rank) for rank in range(self.world)]
        hosted = [Hosted(w, [w.rank]) for w in generation.workers]
        echo = (lambda: self._echo(generation, states)) if self.echo is not None else None
        stuck, stopped = follow(hosted, states, started, deadline, stop_on_failure=self.script, echo=echo,
                                watch=self.watch, still=still)
        for rank in stuck:
            states[rank].end = STUCK
        if echo is None:  # (an echoed run has kept every word as it came)
            for worker in generation.workers:
                states[worker.rank].output = worker.new_output() + worker.new_errors()
        return RunRecord(self.world, deadline, states, time.monotonic() - started, bool(stuck), tier=self.tier,
                         stopped=stopped, ended_at=time.time(), backend=self.backend)

    def _after_run(self, generation: Generation, record: RunRecord) -> None:
        """Destroy what the run made, on every rank, before the next (a script's ranks are done for good); the
        ranks keep the transports that are in step (meshsim.run.transports)."""
        if not self.script:
            if self.keeper.generation != generation.number:
                self.keeper = Keeper(generation.number)  # fresh ranks keep nothing yet
            forget = self.keeper.after(record.states)
            generation.send(Teardown(max(s.group_count for s in record.states) + 1, forget))
            self.pool.forget_work_keys()

    def _echo(self, generation: Generation, states: list[RankState]) -> None:
        assert self.echo is not None
        for worker in generation.workers:
            out = worker.new_output(limit=None)
            for stream, text in (("stdout" if self.split_streams else "output", out), ("stderr", worker.new_errors())):
                if text:
                    states[worker.rank].output += text
                    self.echo(worker.rank, text, stream)


def _first_failure(record: RunRecord) -> str:
    """The first rank that did not finish, and why, in one line."""
    for state in record.states:
        if state.end == FINISHED:
            continue
        reason = state.where
        if state.value is not None:
            try:
                import dill

                error = dill.loads(state.value)
                reason = repr(error[0] if isinstance(error, tuple) else error)
            except Exception:
                pass
        return f"rank {state.rank} {state.end}: {reason}"
    return "it did not finish in time"


def _call_by_name(target: str) -> None:
    """Import "package.module:function" on a rank and call it."""
    import importlib

    module, _, name = target.partition(":")
    if not name:
        raise ValueError(f"setup must look like module:function, got {target!r}")
    getattr(importlib.import_module(module), name)()
