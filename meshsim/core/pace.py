"""Progress is not a hang: whether the ranks that had not finished at the deadline were still completing calls.

A hung rank completes nothing. A run whose every unfinished rank was still completing collectives in the last
moments before it was stopped is too slow for its deadline, and nobody is a culprit. A rank's "last moments" are
measured by its own pace: a window of a few of its longest recent gaps between completed calls (a loaded machine
stalls a rank for a while now and then), never less than MIN_WINDOW_S. Where every unfinished rank looks recent
when the deadline strikes, the run is watched for `grace` more (the longest window): a rank that hung just before
the deadline completes nothing in it, and the run is a hang after all.

Times are the ranks' own wall clocks (meshsim.core.wire.CallReturned.time), so ranks on several hosts compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .wire import FINISHED, STUCK

KEPT = 32  # completion times a rank keeps (its recent pace)
MIN_WINDOW_S = 0.5  # shorter and a rank the machine stalled for a moment would look hung
MAX_WINDOW_S = 5.0  # a rank quiet for longer than this completes nothing: it waits
GAPS = 3.0  # a rank's window: this many of its longest recent gaps between completed calls


@dataclass
class RankPace:
    """How far one rank got and how fast it was going when the run was stopped."""

    rank: int
    completed: int  # calls it completed
    rate: float | None  # calls a second over its recent calls (None: fewer than two)
    quiet: float | None  # seconds from its last completed call to the end of the run (None: it completed none)
    window: float  # how recent a completion must be to count as still moving
    finished: bool

    @property
    def moving(self) -> bool:
        return self.finished or (self.completed >= 2 and self.quiet is not None and self.quiet <= self.window)


def window(times: list[float]) -> float:
    """How recent a rank's last completion must be for it to count as still moving, from its recent gaps."""
    gaps = [b - a for a, b in zip(times, times[1:])]
    widest = max(gaps, default=0.0)
    return min(MAX_WINDOW_S, max(MIN_WINDOW_S, GAPS * widest))


def of_states(states: list[Any], end: float | None) -> list[RankPace]:
    """Every rank's pace at `end` (a wall-clock time); ranks that finished count as moving."""
    out = []
    for s in states:
        times = list(s.done_times)
        rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None
        quiet = end - times[-1] if times and end is not None else None
        out.append(RankPace(s.rank, s.completed, rate, quiet, window(times), s.end == FINISHED and s.done))
    return out


def still_moving(states: list[Any], end: float | None) -> bool:
    """Whether every rank that has not finished was still completing calls at `end` (and one at least had not
    finished): a run stopped then is too slow for its deadline, not hung."""
    if end is None:
        return False
    paces = of_states(states, end)
    unfinished = [p for p in paces if not p.finished]
    return bool(unfinished) and all(p.moving for p in unfinished) and \
        all(s.end in (None, STUCK) or s.end == FINISHED for s in states)


def grace(states: list[Any], end: float) -> float:
    """How much longer to watch a run at its deadline before calling it (0: not at all). Where every unfinished
    rank is still moving, the longest of their windows: a rank that stopped just before the deadline completes
    nothing in it."""
    if not still_moving(states, end):
        return 0.0
    return max(p.window for p in of_states(states, end) if not p.finished)


def rate_text(rate: float) -> str:
    """Calls a second in words: whole numbers from 10 up, two significant figures below (0.25 calls/s is slow,
    not stalled)."""
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"
