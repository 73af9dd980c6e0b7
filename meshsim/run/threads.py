"""The thread executor: one host process whose threads are the ranks, on torch's threaded process group.

torch's threaded process group (torch.testing._internal.distributed.multi_threaded_pg) keeps c10d's world
state per thread and moves tensors between threads in Python, so collectives are real and their results are
checked as on the process tier, without a process or a gloo connection per rank. 64 to 256 ranks fit in one
process on 2 cores.

The ranks live in a child process, not in the controller: the threaded group waits without a timeout, and a
thread cannot be killed, so a hung plan ends by killing the host and starting a fresh one, as a hung rank
process does on the process tier. Messages from the host carry their rank (meshsim.core.wire.FromRank); progress,
deadlines, stacks and the diagnosis are the process tier's, per thread.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import re
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

from ..compat import patching, tiers  # noqa: F401 -- importing tiers registers its patches
from ..core import deadlines
from ..core.errors import ClusterError
from ..core.record import RankState, RunRecord, RunStatus
from ..core.wire import (
    FINISHED,
    PROGRESS,
    STUCK,
    Batch,
    FromRank,
    JoinFailed,
    PlanDone,
    RankDied,
    Ready,
    Report,
    Reported,
    RunFunction,
    RunPlan,
    RunScript,
    Stop,
    Teardown,
    dispatch,
    encoded,
)
from ..spec.platform import CPU
from ..spec.tiers import TIERS, TierError
from ..spec.topology import Topology
from .follow import Hosted, Still, absorb, follow
from .generation import Generation
from .interpreter import Interpreter
from .pool import Pooled, WorkerPool
from .rank import (
    STACK_SIGNAL,
    WorkerSpec,
    _capture_output,
    _die_with_parent,
    _name_process,
    _watch_lifeline,
)
from .still import Stillness, available


class RankEnded(BaseException):
    """An exit or kill fault on a thread rank: the thread ends as the process would have."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class ThreadInterpreter(Interpreter):
    def exit(self, code: int) -> None:
        raise RankEnded(code)

    def kill(self) -> None:
        raise RankEnded(-9)


def host_main(spec: WorkerSpec, conn: Any, lifeline: Any) -> None:
    """The host process: W rank threads on one threaded world, fed the controller's commands."""
    _die_with_parent()
    _watch_lifeline(lifeline)
    _name_process("meshsim-threads")
    warnings.simplefilter("ignore")
    _capture_output(spec.output_file)
    stacks = open(spec.stack_file, "w")
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
    world = spec.hosts * spec.devices_per_host
    store = _threaded_world(conn)
    lock = threading.Lock()
    # Each rank's progress stays here until the controller asks for it (Report: a run past its deadline, quiet for a
    # while, or one that did not end well), or a result other than a plan's goes (in the same message): a pipe
    # message per call from 64 threads cost more than the collectives, and a rank that is a thread cannot die alone
    # with its words unsent. A plan's result goes alone: its progress locates ranks that did not finish, and a run
    # whose every rank finished needs none of it (at W = 64, pickling and reading it back cost a quarter of a plan).
    logs: list[deque[Any]] = [deque() for _ in range(world)]
    done = [False] * world  # the rank has sent its result for the work in hand (its log waits for Report(True))
    asked = [False] * world  # Report(True) came during the work in hand: a plan's result takes its progress along

    def post(rank: int, message: Any) -> None:
        with lock:
            conn.send_bytes(encoded(FromRank(rank, message)))

    def sender(rank: int) -> Any:
        log = logs[rank]

        def send(message: Any) -> None:
            if isinstance(message, PROGRESS):
                log.append(message)
                return
            if isinstance(message, PlanDone) and not asked[rank]:
                done[rank] = True
                post(rank, message)
                return
            events = _drain(log)
            post(rank, Batch((*events, message)) if events else message)
        return send

    def begin(rank: int) -> None:
        """A rank takes new work: what it said of the last is not asked for any more."""
        logs[rank].clear()
        done[rank] = asked[rank] = False

    joined: queue.Queue[tuple[int, Any]] = queue.Queue()
    inboxes: list[queue.Queue[Any]] = [queue.Queue() for _ in range(world)]
    for rank in range(world):
        threading.Thread(target=_rank_thread, args=(rank, world, store, sender(rank), inboxes[rank], joined,
                                                     spec.start_timeout_s, begin),
                         name=f"rank{rank}", daemon=True).start()
    idents: dict[int, int] = {}
    for _ in range(world):
        rank, outcome = joined.get(timeout=spec.start_timeout_s)
        if isinstance(outcome, str):
            conn.send(JoinFailed(f"rank {rank}: {outcome}"))
            os._exit(4)
        idents[rank] = outcome
    conn.send(Ready(os.getpid()))
    conn.send(FromRank(-1, idents))  # thread ident -> rank, to split faulthandler's dump

    def report(finished: bool) -> None:
        if finished:
            asked[:] = [True] * world
        for rank, log in enumerate(logs):
            events = _drain(log) if finished or not done[rank] else None
            if events:
                post(rank, Batch(tuple(events)))
        post(-1, Reported())

    _serve(conn, inboxes, report)


def _threaded_world(conn: Any) -> Any:
    """torch's threaded process group, installed in this process, and the store its ranks meet at (a torch that
    has none: the controller is told, and the host ends)."""
    try:
        import torch
        import torch.distributed as dist
        from torch.testing._internal.distributed.multi_threaded_pg import (
            _install_threaded_pg,
        )

        torch.set_num_threads(1)
        torch._C._distributed_c10d._set_thread_isolation_mode(True)  # type: ignore[attr-defined]  # names per thread
        _install_threaded_pg()
        patching.install("threaded.reduce-scatter-max-min")
        patching.install("ranks-in-one-process.transform-infos")
        return dist.HashStore()
    except Exception as exc:  # this torch has no threaded process group
        conn.send(JoinFailed(f"{type(exc).__name__}: {exc}"))
        os._exit(4)


def _serve(conn: Any, inboxes: list[queue.Queue[Any]], report: Callable[[bool], None]) -> None:
    """The controller's commands, until it stops the host or goes: every rank gets each piece of work; a Report
    is answered here."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(3)
        if isinstance(message, Stop):
            os._exit(0)
        if isinstance(message, Report):
            report(message.finished)
            continue
        for inbox in inboxes:
            inbox.put(message)


def _drain(log: deque[Any]) -> list[Any]:
    """Everything in a rank's log, taken out (popleft is atomic: the rank may be appending, or clearing it for new
    work, meanwhile)."""
    out = []
    while True:
        try:
            out.append(log.popleft())
        except IndexError:
            return out


def _rank_thread(rank: int, world: int, store: Any, send: Any, inbox: queue.Queue, joined: queue.Queue,
                 timeout_s: float, begin: Callable[[int], None]) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from ..compat.progress import bind_thread
    from ..core.deadlines import torch_wait
    from .rank import RankSession

    try:
        dist.init_process_group("threaded", rank=rank, world_size=world, store=store,
                                timeout=timedelta(seconds=torch_wait(timeout_s)))
        session = RankSession(rank, world, "cpu", store, send, interpreter=ThreadInterpreter)
        bind_thread(session.progress)
    except Exception as exc:
        joined.put((rank, f"{type(exc).__name__}: {exc}"))
        return
    joined.put((rank, threading.get_ident()))
    handlers = {
        RunPlan: lambda m: send(session.run_plan(m.plan, m.deadline)),
        RunFunction: lambda m: send(session.run_function(m.payload, m.deadline)),
        Teardown: lambda m: session.teardown(m.next_group_count),
    }
    while True:
        message = inbox.get()
        begin(rank)
        try:
            dispatch(message, handlers)
        except RankEnded as end:
            send(RankDied(end.code))
            return


class ThreadExecutor(Pooled):
    """W ranks as threads of one host process (torch's threaded process group); real collectives.

    >>> with ThreadExecutor(Topology(hosts=8, devices_per_host=8)) as ex:
    ...     record = ex.execute(RunPlan(plan, 10.0))
    """

    tier = "thread"
    capabilities = TIERS["thread"]
    watch: Callable[[RunStatus], None] | None = None  # told how far each run is (a progress bar)
    platform = CPU

    def __init__(self, topology: Topology, deadline: float | None = None, start_timeout: float | None = None):
        if topology.world > self.capabilities.max_world:
            raise ClusterError(f"{topology} is {topology.world} ranks; the thread tier runs at most "
                               f"{self.capabilities.max_world:,} (larger worlds: --tier fake or model)")
        self.topology = topology
        self.deadline, self.start_timeout = deadlines.for_tier(self.tier, topology.world, deadline, start_timeout)
        self.thread_ranks: dict[int, int] = {}  # rank -> thread ident in the host, to split its stack dump
        self.pool = WorkerPool(self._specs, host_main, self.start_timeout, after_start=self._after_start)

    @property
    def world(self) -> int:
        return self.topology.world

    def _specs(self, number: int, tmp: str, port: int) -> list[WorkerSpec]:
        return [WorkerSpec(0, self.topology.hosts, self.topology.devices_per_host, port, f"g{number}/",
                           "threaded", os.path.join(tmp, f"stacks-{number}"), os.path.join(tmp, f"output-{number}"),
                           self.start_timeout)]

    def _after_start(self, generation: Generation) -> None:
        self.thread_ranks = {}
        host = generation.workers[0]
        if host.conn.poll(self.start_timeout):
            message = host.conn.recv()
            if isinstance(message, FromRank) and message.rank == -1:
                self.thread_ranks = message.message

    def execute(self, work: Any, meanwhile: Callable[[], Any] | None = None,
                if_hangs: Callable[[], float | None] | None = None) -> RunRecord:
        if isinstance(work, RunScript):
            raise TierError("the thread tier runs plans and functions; a script needs the process tier")
        generation = self.pool.current()
        started = time.monotonic()
        generation.send(work)
        if meanwhile is not None:
            meanwhile()
        states = [RankState(rank) for rank in range(self.world)]
        host = Hosted(generation.workers[0], list(range(self.world)))
        still, deadline = None, work.deadline
        hang_wait = if_hangs() if if_hangs is not None and isinstance(work, RunPlan) else None
        if hang_wait is not None:
            deadline = min(deadline, hang_wait)
            if available():
                still = Still(Stillness(), dict.fromkeys(range(self.world), host.worker.pid))
        stuck, stopped = follow([host], states, started, deadline, watch=self.watch,
                                on_quiet=lambda: _ask(host), still=still)
        if stuck or any(s.end != FINISHED for s in states):  # what went wrong is located from the ranks' progress
            stuck = _reported(host, states, stuck)
        for rank in stuck:
            states[rank].end = STUCK
        record = RunRecord(self.world, deadline, states, time.monotonic() - started, bool(stuck),
                           tier=self.tier, stopped=stopped, ended_at=time.time())
        if record.timed_out or record.died:
            record.stacks = self._stacks(generation, record.stuck)
            self.pool.refresh()
        else:
            generation.send(Teardown(max(s.group_count for s in states) + 1))
            self.pool.forget_work_keys()
        return record

    def _stacks(self, generation: Generation, ranks: list[int]) -> dict[int, str]:
        dump = generation.stacks([0]).get(0, "")
        by_ident = {ident: rank for rank, ident in self.thread_ranks.items()}
        out: dict[int, str] = {}
        for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump):
            found = re.match(r"(?:Current thread|Thread) (0x[0-9a-f]+)", block)
            if found and by_ident.get(int(found.group(1), 16)) in ranks:
                out[by_ident[int(found.group(1), 16)]] = block
        return out


REPORT_WAIT_S = 5.0  # how long the host gets to send its ranks' progress when asked


def _ask(host: Hosted) -> None:
    """Ask the host for its ranks' progress so far (what a quiet run waits for); the answer comes as messages."""
    try:
        host.worker.conn.send_bytes(encoded(Report()))
    except (BrokenPipeError, OSError):
        pass


def _reported(host: Hosted, states: list[RankState], stuck: set[int]) -> set[int]:
    """Ask the host what its ranks did so far, finished or not, and take it in; returns the ranks still unfinished."""
    worker = host.worker
    try:
        worker.conn.send(Report(finished=True))
        end = time.monotonic() + REPORT_WAIT_S
        while time.monotonic() < end and worker.conn.poll(max(0.0, end - time.monotonic())):
            message = worker.conn.recv()
            if not isinstance(message, FromRank):
                continue
            if isinstance(message.message, Reported):
                break
            if 0 <= message.rank < len(states) and absorb(states[message.rank], message.message):
                stuck.discard(message.rank)  # it finished just now
    except (EOFError, OSError):
        pass  # the host is gone: what it had not sent is lost with it
    return stuck
