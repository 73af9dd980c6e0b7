"""Whether a run's ranks have all stopped moving: the proof of a hang that need not wait for the deadline.

A rank that waits in a collective whose peers will never come sleeps in the kernel and uses no CPU, and so do all
of its threads (gloo's workers block on their sockets). When every thread of every unfinished rank sleeps and has
not run for a while, and no thread of the controller's that the ranks could be waiting for is runnable (the
store's server thread lives here), nothing can wake them: data in flight on loopback, a peer that is merely slow
or descheduled and a store reply all show as a runnable thread or as CPU time used. Waiting on for the deadline
would only confirm it.

Only what a run cannot do otherwise is called still: a rank whose plan step sleeps by design (the `sleep` fault)
is moving, and so is one being traced (py-spy stops it to sample it). The process tier asks for this only where
the model says torch hangs (a plan that sweeps confirm), or while a sweep shrinks a hang.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable

MOVING_STATES = frozenset("RDtTW")  # runnable, in the disk's wait, stopped or traced, paging
STILL_FOR_S = 0.15  # this long without a thread running anywhere a rank could wait on
PERIOD_S = 0.05  # how often the ranks are looked at while they are quiet
# gloo's socket loops wake every 10 ms to see whether they should end (about a microsecond of CPU each): such a
# thread may run this much between two looks and still be idle. What it reads off a socket wakes the thread that
# waits for it, which then runs (a loop busy with data is runnable, or uses far more).
TICKING_THREADS = ("gloo_tcp_loop",)
TICK_NS = 1_000_000

Threads = dict[tuple[int, str], tuple[bool, int]]  # (pid, tid) -> (ticks by design, nanoseconds run)


def _threads(pid: int, skip: int | None = None) -> Threads | None:
    """The process's threads and how long each has run, or None if one of them is runnable (or cannot be read
    while it exists: not provably still). `skip`: a thread left out (the one that asks)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}  # gone: it runs nothing
    found: Threads = {}
    for tid in tids:
        if skip is not None and int(tid) == skip:
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                name, rest = fh.read().split("(", 1)[1].rsplit(")", 1)
            if rest.split()[0] in MOVING_STATES:
                return None
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                found[(pid, tid)] = (name in TICKING_THREADS, int(fh.read().split()[0]))
        except (OSError, ValueError, IndexError):
            if os.path.exists(f"/proc/{pid}/task/{tid}"):
                return None
    return found


def _same(before: Threads, now: Threads) -> bool:
    """No thread ran between the two looks (but for the ticks of a thread that ticks by design)."""
    if before.keys() != now.keys():
        return False
    return all(now[key][1] - run <= (TICK_NS if ticks else 0) for key, (ticks, run) in before.items())


class Stillness:
    """Looks at the given processes now and then; `look` is True once none of them has run for STILL_FOR_S (and
    this process has had nothing to do for them)."""

    def __init__(self, still_for_s: float = STILL_FOR_S):
        self.still_for_s = still_for_s
        self._me = threading.get_native_id()
        self._since: float | None = None  # when the current still stretch began
        self._last: Threads | None = None

    def moved(self) -> None:
        """Something happened (a message came): a still stretch starts over."""
        self._since = self._last = None

    def look(self, pids: Iterable[int]) -> bool:
        seen: Threads = {}
        for pid in pids:
            threads = _threads(pid)
            if threads is None:
                self.moved()
                return False
            seen.update(threads)
        # This process serves the store the ranks may wait on: a thread of it that is runnable has work to do for
        # them (one that ran and is done has woken the rank it served, whose time shows). Its other threads come
        # and go (a spare generation's launcher, its world joining through the same store): only their states
        # count.
        if _threads(os.getpid(), skip=self._me) is None:
            self.moved()
            return False
        now = time.monotonic()
        if self._last is None or not _same(self._last, seen):
            self._last, self._since = seen, now
            return False
        self._last = seen  # (a ticking thread's ticks do not add up to a move)
        assert self._since is not None
        return now - self._since >= self.still_for_s


def available() -> bool:
    """Whether this system shows threads' states and run times (Linux's /proc)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat")
