"""How a run ends: one rule, for the model and the judge alike (who is to blame: meshsim.judge.blame).

Pure: the model predicts with these and the judge observes with them, so the two can only disagree about the
facts, never about the rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from .wire import DIED, RAISED

PASS, MISMATCH, ERROR, HANG, CRASH = "pass", "mismatch", "error", "hang", "crash"
OUTCOMES = (PASS, MISMATCH, ERROR, HANG, CRASH)
UNDEFINED = "undefined"  # torch's outcome is a race: any outcome is torch's


def outcome_of(ends: Iterable[str | None], hung: bool, differs: bool = False) -> str:
    """A dead rank makes a crash, else a raising one an error, else waiting past the deadline a hang,
    else any difference from the model a mismatch."""
    seen = set(ends)
    if DIED in seen:
        return CRASH
    if RAISED in seen:
        return ERROR
    if hung:
        return HANG
    return MISMATCH if differs else PASS
