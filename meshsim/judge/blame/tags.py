"""Sends and receives that cannot pair: under different tags, or on different process groups.

gloo pairs a send with the receive of the same tag from the same peer (NCCL ignores tags; meshsim's simulated GPUs
do too), so a send and a receive between the same two ranks, in the same direction, whose tags differ both wait:
each is the call the other waits for, and neither completes. Which side holds the wrong tag: the one whose tag
already carried a message between the two ranks (a backward send reusing the forward tags), where only one does;
else the evidence cannot decide and both are candidates.

A send or receive pairs only on its own process group, too. A rank that waits in one on a group its earlier sends
and receives were not on, at a line no rank but those held with it reached, while a peer waits to exchange with it
on the group it used before, made that call on the wrong group (a helper that passes a global `src` and no `group`).
"""

from __future__ import annotations

from ...core.outcome import KINDS
from ...core.ranks import ranks_text
from ...core.record import RankState
from ...core.wire import RECVS, SENDS, CallBegun, channel_ends, channel_group
from .calls import Cause, reached_only_by, site_text


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


def off_group_channels(states: list[RankState], held: dict[int, CallBegun]) -> dict[int, Cause]:
    """Ranks held in a send or receive on another process group than their earlier sends and receives, at a line
    of their own, while a peer waits to exchange with them on that earlier group."""
    found: dict[int, Cause] = {}
    for r, call in sorted(held.items()):
        ends = channel_ends(call.group)
        if ends is None or call.site is None:
            continue
        group = channel_group(call.group)
        used = {channel_group(g) for g, _ in states[r].call_log if channel_ends(g) is not None} - {group}
        mine = [g for g, q in states[r].call_log if channel_ends(g) is not None and channel_group(g) == group
                and (g, q) != (call.group, call.seq)]
        peer = ends[0] if call.kind in RECVS else ends[1]
        # (the peer of this very call first: the head that waits to send to the stage whose receive is elsewhere)
        waiting = sorted(((p, c) for p, c in held.items() if p != r and channel_group(c.group) in used
                          and r in (channel_ends(c.group) or (None, None))[:2]), key=lambda pc: (pc[0] != peer, pc[0]))
        there = {p for p, c in held.items() if c.site == call.site}
        if mine or not waiting or not reached_only_by(states, call.site, there):
            continue
        p, theirs = waiting[0]
        way = "receives from" if call.kind in RECVS else "sends to"
        where = f" (mesh dim {theirs.context[1]!r})" if theirs.context and len(theirs.context) > 1 else ""
        towards = "send to" if theirs.kind in SENDS else "receive from"
        found[r] = Cause(r, KINDS["mismatched"], (
            f"rank {r} {way} rank {peer} on process group {group} at {site_text(call.site)}, a line no rank but "
            f"{ranks_text(sorted(there))} reached, where its earlier sends and receives were on group "
            f"{channel_group(theirs.group)}{where}: rank {p} waits to {towards} it there, and a send pairs with a "
            "receive on its own group only"), call.group, call.seq)
    return found
