"""What the culprit rule says and the questions it asks of calls: a cause, a blame, where a rank is held, who is
missing from a call, a group's members."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.record import RankState
from ...core.wire import RAISED, STUCK, CallBegun, channel_ends


@dataclass
class Cause:
    """Why one rank is a culprit: the kind, in words, and the call of its group it missed or mismatched."""

    rank: int
    kind: str
    text: str
    group: str | None = None
    seq: int | None = None  # the call's position on its group, from 0
    candidate: bool = False  # the evidence cannot decide: the rank may be to blame, or may wait as it should

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "kind": self.kind, "group": self.group, "seq": self.seq, "text": self.text,
                "candidate": self.candidate}


@dataclass
class Blame:
    """The kind of failure, its culprits with their causes (the most telling first), and what the others did."""

    kind: str
    culprits: list[int]
    note: str = ""
    victims: dict[int, str] = field(default_factory=dict)
    causes: list[Cause] = field(default_factory=list)
    candidates: list[Cause] = field(default_factory=list)  # the evidence cannot decide: who may be, and why


def same_call(a: CallBegun | None, b: CallBegun | None) -> bool:
    """Whether two ranks are in the same blocking call (same group, same position on it)."""
    if a is None or b is None:
        return False
    if a.kind == "new_group":
        return b.kind == "new_group" and b.group == a.group and b.ranks == a.ranks
    return b.kind == a.kind and b.group == a.group and b.seq == a.seq


def blocked_call(state: RankState) -> CallBegun | None:
    """The call a rank is held in: the one it waits in, or the one that raised on it."""
    if state.end == STUCK and state.waiting_on is not None:
        return state.waiting_on
    if state.end == RAISED and state.failed_in is not None:
        return state.failed_in
    return None


def missing_from(call: CallBegun, states: list[RankState]) -> list[int]:
    """The members of `call`'s group that are not in that same call."""
    return [m for m in call.ranks if m < len(states) and not same_call(call, blocked_call(states[m]))]


def held_in(state: RankState, group: str, seq: int) -> bool:
    """Whether the rank is held in that very call (it has not completed it)."""
    call = blocked_call(state)
    return call is not None and call.group == group and call.seq == seq


def members_of(states: list[RankState], group: str) -> list[int]:
    for s in states:
        if s.waiting_on is not None and s.waiting_on.group == group:
            return list(s.waiting_on.ranks)
        if group in s.created:
            return list(s.created[group])
    return [s.rank for s in states if group in s.calls_on]


def site_text(site: Any) -> str:
    return f"step {site}" if isinstance(site, int) else str(site)


def between(r: int, channel: str) -> str:
    """Whom rank r sends to or receives from on a point-to-point channel, in words."""
    src, dst, _ = channel_ends(channel) or (None, None, 0)
    return f"to rank {dst}" if src == r else f"from rank {src}"


def reached_only_by(states: list[RankState], site: Any, inside: set[int]) -> bool:
    """No rank but these made a call at this line (or plan step)."""
    return not any(entry[0] == site for s in states if s.rank not in inside for entry in s.call_log.values())


def own_line(states: list[RankState], r: int) -> bool:
    """Whether rank r made a call at a line no other rank reached."""
    others = {site for s in states if s.rank != r for site, _ in s.call_log.values()}
    return any(site not in others for site, _ in states[r].call_log.values())
