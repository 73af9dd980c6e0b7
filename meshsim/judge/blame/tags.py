"""Sends and receives that wait for each other under different tags.

gloo pairs a send with the receive of the same tag from the same peer (NCCL ignores tags; meshsim's simulated GPUs
do too), so a send and a receive between the same two ranks, in the same direction, whose tags differ both wait:
each is the call the other waits for, and neither completes. Which side holds the wrong tag: the one whose tag
already carried a message between the two ranks (a backward send reusing the forward tags), where only one does;
else the evidence cannot decide and both are candidates.
"""

from __future__ import annotations

from ...core.outcome import KINDS
from ...core.record import RankState
from ...core.wire import RECVS, SENDS, CallBegun, channel_ends, channel_group
from .calls import Cause, site_text


def tag_causes(states: list[RankState], held: dict[int, CallBegun]) -> dict[int, Cause]:
    """For every send held while its peer is held in a receive from it under another tag: the side that reused a
    tag (a culprit), or both sides (candidates)."""
    found: dict[int, Cause] = {}
    for _, send in sorted(held.items()):
        ends = channel_ends(send.group) if send.kind in SENDS else None
        if ends is None or ends[1] not in held:
            continue
        src, dst, tag = ends
        recv = held[dst]
        theirs = channel_ends(recv.group) if recv.kind in RECVS else None
        if theirs is None or theirs[:2] != (src, dst) or theirs[2] == tag \
                or channel_group(recv.group) != channel_group(send.group):
            continue
        text = (f"rank {src} sends to rank {dst} with tag {tag} at {site_text(send.site)} while rank {dst} waits to "
                f"receive from it with tag {theirs[2]} at {site_text(recv.site)}: gloo pairs a send with the receive "
                "of its own tag, so both wait")
        reused = {r: _used_before(states[r], src, dst, t, call) for r, t, call in ((src, tag, send),
                                                                                  (dst, theirs[2], recv))}
        if sum(reused.values()) == 1:
            culprit = next(r for r, used in reused.items() if used)
            t = tag if culprit == src else theirs[2]
            found[culprit] = Cause(culprit, KINDS["tag"], text + f"; tag {t} already carried a message between the "
                                   f"two, and rank {culprit} uses it again", held[culprit].group, held[culprit].seq)
        else:
            for r in (src, dst):
                found.setdefault(r, Cause(r, KINDS["tag"], text, held[r].group, held[r].seq, candidate=True))
    return found


def _used_before(state: RankState, a: int, b: int, tag: int, held: CallBegun) -> bool:
    """Whether rank `state` sent or received a message under `tag` between ranks a and b before its held call."""
    for group, seq in state.call_log:
        ends = channel_ends(group)
        if ends is None or {ends[0], ends[1]} != {a, b} or ends[2] != tag \
                or channel_group(group) != channel_group(held.group):
            continue
        if group != held.group or seq < held.seq:
            return True
    return False
