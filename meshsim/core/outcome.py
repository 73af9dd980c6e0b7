"""How a run ends: one rule, for the model and the judge alike, and the kinds of failure that the judge names
(who is to blame: meshsim.judge.blame).

Pure: the model predicts with these and the judge observes with them, so the two can only disagree about the
facts, never about the rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from .wire import DIED, RAISED

PASS, MISMATCH, ERROR, HANG, CRASH = "pass", "mismatch", "error", "hang", "crash"
SLOW = "slow"  # time ran out while every unfinished rank was still completing calls (meshsim.core.pace)
OUTCOMES = (PASS, MISMATCH, ERROR, HANG, CRASH, SLOW)
UNDEFINED = "undefined"  # torch's outcome is a race: any outcome is torch's


def outcome_of(ends: Iterable[str | None], hung: bool, differs: bool = False, moving: bool = False) -> str:
    """A dead rank makes a crash, else a raising one an error, else running past the deadline a hang (or, where
    every unfinished rank was still completing calls, `moving`, a run too slow for its deadline), else any
    difference from the model a mismatch."""
    seen = set(ends)
    if DIED in seen:
        return CRASH
    if RAISED in seen:
        return ERROR
    if hung:
        return SLOW if moving else HANG
    return MISMATCH if differs else PASS


# The kinds of failure a diagnosis names (meshsim.judge.blame), named once: key -> the words every report uses.
KINDS = {
    "dead": "dead rank",
    "raised": "exception on a rank",
    "left": "rank left early",
    "straggler": "straggler past the deadline",
    "inconsistent": "inconsistent mesh across ranks",
    "subset": "group creation on a subset of ranks",
    "reordered": "reordered collectives",
    "skipped": "skipped collective",
    "mismatched": "mismatched collective",
    "size": "tensor sizes differ across ranks",
    "collision": "groups crossed under one name",
    "tag": "send and recv tags differ",
    "unknown": "ranks waiting, cause unclear",
    "rendezvous": "stuck in the rendezvous",
    "slow": "too slow for its deadline",
}
# The outcome a kind implies, where it implies one: a dead rank makes a crash, an exception an error, a run still
# moving at its deadline is too slow. Any other kind is a hang, or whatever a rank that raised or died on the way
# made it (a rank that left early by sys.exit(1) is an error; other sizes than its peers', a crash where gloo
# aborted a rank).
IMPLIED = {KINDS["dead"]: CRASH, KINDS["raised"]: ERROR, KINDS["slow"]: SLOW}


def implied(kind: str) -> str | None:
    """The outcome a run whose failure is of this kind ends in (None: the kind does not say)."""
    return IMPLIED.get(kind)
