"""How a run ends, and who is to blame: one rule each, for the model, the verdict, user functions and the diagnosis.

Pure: the model predicts with these and the judge observes with them, so the two can only disagree about the
facts, never about the rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from .wire import DIED, RAISED

PASS, MISMATCH, ERROR, HANG, CRASH = "pass", "mismatch", "error", "hang", "crash"
OUTCOMES = (PASS, MISMATCH, ERROR, HANG, CRASH)
UNDEFINED = "undefined"  # torch's outcome is a race: any outcome is torch's


def outcome_of(ends: Iterable[str], hung: bool, differs: bool = False) -> str:
    """A dead rank makes a crash, else a raising one an error, else waiting past the deadline a hang,
    else any difference from the model a mismatch."""
    ends = set(ends)
    if DIED in ends:
        return CRASH
    if RAISED in ends:
        return ERROR
    if hung:
        return HANG
    return MISMATCH if differs else PASS


def blame(dead: Iterable[int] = (), raised: Iterable[int] = (), late: Iterable[int] = (),
          evidence: Iterable[int] = (), divergent: Iterable[int] = (), waited_for: Iterable[int] = ()) -> list[int]:
    """The culprit ranks: the first non-empty of ranks that died, ranks that raised, stragglers past the
    deadline, what the waits show (the diagnosis), ranks the plan makes diverge, and ranks others wait for."""
    for ranks in (dead, raised, late, evidence, divergent, waited_for):
        found = sorted(set(ranks))
        if found:
            return found
    return []
