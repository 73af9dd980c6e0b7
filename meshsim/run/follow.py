"""The one loop that follows a run on worker processes: the process, thread and fake tiers all use it.

A worker hosts one rank (process tier) or many (a thread host, a fake player); a message from a worker that
hosts many carries its rank (meshsim.core.wire.FromRank). The loop reads every worker's progress until each rank has
sent its result, a worker died (then the others get a short grace), or time ran out. Time runs from the start of
the run, or, where a worker plays its ranks one after another (fake), from the last message of that worker.
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core import deadlines, pace
from ..core.ranks import ranks_text
from ..core.record import RankState, RunStatus
from ..core.wire import (
    DIED,
    FINISHED,
    RAISED,
    Batch,
    FromRank,
    FunctionDone,
    PlanDone,
    RankDied,
    ScriptDone,
)
from .generation import Worker
from .still import PERIOD_S, Stillness

RESULTS = (RankDied, PlanDone, FunctionDone, ScriptDone)  # how a rank's part of a run ends
CATCH_UP_S = 1.0  # the most the controller reads the ranks' backlog for at the deadline


@dataclass
class Hosted:
    """A worker and the ranks it still owes a result."""

    worker: Worker
    pending: list[int]
    heard: float = field(default_factory=time.monotonic)


def absorb(state: RankState, message: Any) -> bool:
    """Take one message of a rank into its state; True once it is how the rank ended."""
    if isinstance(message, Batch) and any(isinstance(m, RESULTS) for m in message.events):
        ended = False
        for inner in message.events:  # a rank's progress, then its result
            ended = absorb(state, inner) or ended
        return ended
    if isinstance(message, RankDied):  # a rank that is a thread or a loop iteration "died" (exit/kill fault)
        state.end, state.exitcode = DIED, message.exitcode
        return True
    if isinstance(message, PlanDone):
        state.observations, state.end, state.end_step = message.observations, message.end, message.end_step
        state.transports = message.transports
    elif isinstance(message, FunctionDone):
        state.value, state.end = message.value, FINISHED if message.ok else RAISED
    elif isinstance(message, ScriptDone):
        state.value, state.end = message, FINISHED if message.exit_code == 0 else RAISED
    else:
        state.on_event(message)  # progress; any other kind is refused there
        return False
    state.group_count, state.done = message.group_count, True
    return True


def follow(hosted: list[Hosted], states: list[RankState], started: float, deadline: float, *,
           from_last_message: bool = False, stop_on_failure: bool = False,
           echo: Callable[[], None] | None = None, watch: Callable[[RunStatus], None] | None = None,
           on_quiet: Callable[[], None] | None = None, still: Still | None = None) -> tuple[set[int], str]:
    """Follow until every rank has ended or time is up; returns the ranks still pending (stuck), and what stopped
    the run (meshsim.core.record.STOPPED: every rank ended, the deadline, or a failure and its grace).

    from_last_message: a worker's time restarts with each message it sends (a worker that plays ranks in turn);
    stop_on_failure: a rank that raises stops the run after a grace, as torchrun stops a job; echo: called about
    five times a second while the run goes on (live output); watch: told twice a second how far the run is, and
    after deadlines.QUIET_S without a word from the ranks, what they wait for; on_quiet: called when the ranks have
    been quiet for half that (a host that keeps its ranks' progress is asked for it then); still: the ranks may be
    called stuck before the deadline once none of them moves (meshsim.run.still), each rank's process by `pids`.
    """
    first_death: float | None = None
    ticker = _Ticker(hosted, states, started, echo, watch, on_quiet)
    try:
        first_death, went_still = _loop(hosted, states, started, deadline, from_last_message, stop_on_failure, ticker,
                                        still)
        _catch_up(hosted, states)
        extra = 0.0 if first_death is not None or went_still or from_last_message or \
            not any(h.pending for h in hosted) else pace.grace(states, time.time())
        if extra > 0:  # every unfinished rank still completes calls: watch a little longer before calling it
            first_death, went_still = _loop(hosted, states, started, deadline + extra, from_last_message,
                                            stop_on_failure, ticker, still)
            _catch_up(hosted, states)
    except KeyboardInterrupt:  # Ctrl-C where the caller lets it through (launch): the run so far is the record
        return {rank for h in hosted for rank in h.pending}, "interrupted"
    ticker.last()
    pending = {rank for h in hosted for rank in h.pending}
    if not pending:
        return pending, "finished"
    return pending, "failure" if first_death is not None else "still" if went_still else "deadline"


@dataclass
class Still:
    """What follow() needs to call a run's ranks stuck before its deadline: a Stillness and each rank's process."""

    stillness: Stillness
    pids: dict[int, int]  # rank -> pid

    def look(self, states: list[RankState], pending: list[int]) -> bool:
        if any(states[rank].op == "sleep" for rank in pending):  # asleep by design: it will move again
            self.stillness.moved()
            return False
        return self.stillness.look(sorted({self.pids[rank] for rank in pending if rank in self.pids}))


class _Ticker:
    """What follow() does now and then while a run goes on: echo output, tell a watcher, ask a quiet host."""

    def __init__(self, hosted: list[Hosted], states: list[RankState], started: float,
                 echo: Callable[[], None] | None, watch: Callable[[RunStatus], None] | None,
                 on_quiet: Callable[[], None] | None):
        self.hosted, self.states, self.started = hosted, states, started
        self.echo, self.watch, self.on_quiet = echo, watch, on_quiet
        self.period = 0.2 if echo is not None else 0.5 if watch is not None or on_quiet is not None else None
        self.asked = 0.0  # when on_quiet was last called
        self.ticked = 0.0  # when it last ran: a run's messages come far more often than its period
        self.total = sum(len(h.pending) for h in hosted)  # the ranks this run follows (a sample, on the fake tier)

    def __call__(self) -> None:
        now = time.monotonic()
        if self.period is None or now - self.ticked < self.period:
            return
        self.ticked = now
        if self.echo is not None:
            self.echo()
        quiet = now - max([self.started] + [h.heard for h in self.hosted])
        if self.on_quiet is not None and quiet >= deadlines.QUIET_S / 2 and now - self.asked >= deadlines.QUIET_S:
            self.asked = now
            self.on_quiet()
        if self.watch is not None:
            pending = [rank for h in self.hosted for rank in h.pending]
            waiting = waiting_for(self.states, pending) if quiet >= deadlines.QUIET_S else ""
            self.watch(RunStatus(self.total - len(pending), self.total, now - self.started, quiet, waiting))

    def last(self) -> None:
        if self.echo is not None:
            self.echo()
        if self.watch is not None:
            pending = sum(len(h.pending) for h in self.hosted)
            self.watch(RunStatus(self.total - pending, self.total, time.monotonic() - self.started, 0.0, ""))


def waiting_for(states: list[RankState], pending: list[int], shown: int = 3) -> str:
    """Where the unfinished ranks are, alike ones together: "ranks 0-3,5 in all_reduce on group [...] (step 2);
    rank 4 running step 1 (sleep) outside any collective"."""
    where: dict[str, list[int]] = {}
    for rank in pending:
        where.setdefault(states[rank].where, []).append(rank)
    parts = [f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)} {text}"
             for text, ranks in sorted(where.items(), key=lambda kv: -len(kv[1]))[:shown]]
    more = f"; and {len(where) - shown} more places" if len(where) > shown else ""
    return "; ".join(parts) + more


def _loop(hosted: list[Hosted], states: list[RankState], started: float, deadline: float, from_last_message: bool,
          stop_on_failure: bool, tick: _Ticker, still: Still | None) -> tuple[float | None, bool]:
    """follow()'s loop; returns when the first rank died or failed (None: none did), and whether the ranks went
    still."""
    first_death: float | None = None
    with selectors.DefaultSelector() as selector:
        for host in hosted:
            selector.register(host.worker.conn, selectors.EVENT_READ, (host, False))
            selector.register(host.worker.process.sentinel, selectors.EVENT_READ, (host, True))
        while any(h.pending for h in hosted):
            now = time.monotonic()
            limits = [(h.heard if from_last_message else started) + deadline for h in hosted if h.pending]
            limit = min(limits) if from_last_message else started + deadline
            if first_death is not None:
                limit = min(limit, first_death + deadlines.DEATH_GRACE_S)
            if limit - now <= 0:
                break
            if tick.period is not None:
                tick()
            timeout = limit - now if tick.period is None else min(limit - now, tick.period)
            if still is not None:
                timeout = min(timeout, PERIOD_S)
            events = selector.select(timeout=timeout)
            if still is not None and first_death is None:
                if events:
                    still.stillness.moved()
                elif still.look(states, [rank for h in hosted for rank in h.pending]):
                    return first_death, True
            for key, _ in events:
                host, is_sentinel = key.data
                if not host.pending:
                    continue
                ended, died, raised = _drain(host, states)
                if died or (raised and stop_on_failure) or ((ended or is_sentinel) and _bury(host, states)):
                    first_death = first_death or time.monotonic()
                if not host.pending:
                    selector.unregister(host.worker.conn)
                    selector.unregister(host.worker.process.sentinel)
    return first_death, False


def _catch_up(hosted: list[Hosted], states: list[RankState]) -> None:
    """At the deadline, read what the ranks said before it that is still in their pipes (under load, a busy rank's
    messages queue behind the others'): judged on a backlog, a rank that moves looks stuck calls ago, and ranks
    that meet in every call look as if they parted. Bounded: the ranks go on talking while it reads."""
    until = time.monotonic() + CATCH_UP_S
    for host in hosted:
        if host.pending:
            _drain(host, states, until)


def _drain(host: Hosted, states: list[RankState], until: float | None = None) -> tuple[bool, bool, bool]:
    """Read what the worker sent (until `until`, by the monotonic clock, at most). Returns (its pipe ended, one of
    its ranks died, one raised)."""
    died = raised = False
    try:
        while host.pending and host.worker.readable() and (until is None or time.monotonic() < until):
            message = host.worker.conn.recv()
            rank = host.pending[0] if len(host.pending) == 1 and not isinstance(message, FromRank) else None
            if isinstance(message, FromRank):
                rank, message = message.rank, message.message
            if rank is None or rank not in host.pending:
                continue
            host.heard = time.monotonic()
            if absorb(states[rank], message):
                host.pending.remove(rank)
                died = died or states[rank].end == DIED
                raised = raised or states[rank].end == RAISED
    except (EOFError, OSError):
        return True, died, raised
    return False, died, raised


def _bury(host: Hosted, states: list[RankState]) -> bool:
    """The worker is gone (its pipe ended, or it exited): its pending ranks died with it. True if any did."""
    worker = host.worker
    worker.process.join(0.5)
    _drain(host, states)  # what it said before it died
    dead = list(host.pending)
    for rank in dead:
        states[rank].end, states[rank].exitcode = DIED, worker.process.exitcode
    host.pending.clear()
    return bool(dead)
