"""Pipelines' own rules: where stages make different calls by design, what the run's other ranks did tells the
stage that departs (a wait on a point-to-point channel, or on a pair of ranks no mesh dim made; meshsim.judge.blame.
cycles asks these after its pattern rules).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...core.outcome import KINDS
from ...core.ranks import group_text
from ...core.record import RankState
from ...core.wire import CallBegun, channel_ends
from .calls import Cause, between, reached_only_by, site_text
from .parts import StateOrder
from .siblings import added_off_the_path, group_members, on_their_way


def lone_channels(states: list[RankState], held: dict[int, CallBegun]) -> dict[int, Cause]:
    """A rank held in its first send or receive with a peer that never exchanged anything with it, in either
    direction, though the peer went round its loop (a line of its called twice) and completed calls with others:
    the two have no link in the program (a tp rank 1 sending its gradient across hosts, where only tp rank 0 makes
    that hop). Its call has no counterpart; the ranks behind it wait as they should."""
    found: dict[int, Cause] = {}
    for r, call in sorted(held.items()):
        ends = channel_ends(call.group)
        if ends is None or r not in ends[:2]:
            continue
        peer = ends[1] if ends[0] == r else ends[0]
        if peer >= len(states) or _exchanged(states[peer], r) or _exchanged(states[r], peer, but=call.group):
            continue
        lines = Counter(site for site, _ in states[peer].call_log.values())
        if lines and max(lines.values()) >= 2 and states[peer].completed:
            found[r] = Cause(r, KINDS["mismatched"], (
                f"rank {r} waits in {call.kind} #{call.seq} {between(r, call.group)}, and rank {peer} never sent "
                f"to it or received from it, though it went round its loop and completed {states[peer].completed} "
                f"calls with others: rank {r}'s call has no counterpart in the program"), call.group, call.seq)
    return found if found and 2 * len(found) < len(states) else {}


def _exchanged(state: RankState, other: int, but: str | None = None) -> bool:
    """Whether the rank made a send or receive with `other` (on a channel other than `but`)."""
    for group, _ in state.call_log:
        ends = channel_ends(group)
        if group != but and ends is not None and other in ends[:2] and state.rank in ends[:2]:
            return True
    return False


def off_the_common_turn(states: list[RankState], held: dict[int, CallBegun], order: StateOrder) -> dict[int, Cause]:
    """Ranks whose held call is not where the run's other ranks went from the same point: after their n-th call at
    a line, twice as many ranks made their next call at another line, and some of them completed it (a frozen
    pipeline stage that skips its backward: after its last forward send it receives the next step's input, where
    every other stage receives a gradient), unless whom it waits for is on the way to it. Held at a line of its own
    (no rank of the others' way calls there), it makes its call first, in another order. Of those, one that waits
    for another such rank is held up by it. Pipelines only (a wait on a channel, or on a pair no mesh dim made):
    the ranks of a mesh dim's groups make the same calls, which the sibling rules compare."""
    if not any(channel_ends(c.group) is not None or (
            order.roles.get(c.group, ("",))[0] != "dim" and len(group_members(states, c.group)) == 2)
            for c in held.values()):
        return {}
    turns: dict[tuple[Any, int], Counter[Any]] = {}
    went: dict[int, tuple[tuple[Any, int], Any]] = {}
    nexts: dict[int, dict[tuple[Any, int], Any]] = {}  # rank -> (line, n) -> its next call's line
    for s in states:
        sites = [s.call_log.get(key, (None, None))[0] for key in s.issued]
        if any(not isinstance(site, str) for site in sites):
            return {}  # a plan's steps: its ranks run the plan, not a program of lines
        seen: Counter[Any] = Counter()
        call = held.get(s.rank)
        at = s.issued.index((call.group, call.seq)) if call is not None and (call.group, call.seq) in s.issued \
            else None
        for i, site in enumerate(sites[:-1]):
            seen[site] += 1
            point = (site, seen[site])
            turns.setdefault(point, Counter())[sites[i + 1]] += 1
            nexts.setdefault(s.rank, {})[point] = sites[i + 1]
            if at is not None and i + 1 == at:
                went[s.rank] = (point, sites[i + 1])
    odd: dict[int, Cause] = {}
    off_path = added_off_the_path(states, held)
    for r, (point, site) in sorted(went.items()):
        common, count = turns[point].most_common(1)[0]
        minority = {q for q, (there, went_to) in went.items() if there == point and went_to == site}
        # (a rank whose next call there is the one it is held in has not completed it)
        completed = any(w != r and theirs.get(point) == common and went.get(w, (None,))[0] != point
                        for w, theirs in nexts.items())
        if common != site and count >= 2 * turns[point][site] and completed and \
                not on_their_way(states, held, r, site) and not _its_way(nexts[r], turns, point, site):
            if reached_only_by(states, held[r].site, minority) and r in off_path:
                continue  # a line of its own that is a call off the path (siblings.added_off_the_path says so)
            odd[r] = _reordered_turn(states, r, held[r], point, common, minority) or Cause(r, KINDS["mismatched"], (
                f"rank {r} waits in {held[r].kind} #{held[r].seq} at {site_text(site)}, where after their call "
                f"#{point[1]} at {site_text(point[0])} {count} ranks went on to {site_text(common)} and completed "
                f"it: rank {r} left the path the others take there"), held[r].group, held[r].seq)
    behind = {r for r in odd if set(odd) - {r} & set(held[r].ranks)}
    found = {r: c for r, c in odd.items() if r not in behind}
    return found if found and 2 * len(found) < len(states) else {}


def _its_way(mine: dict[tuple[Any, int], Any], turns: dict[tuple[Any, int], Counter[Any]], point: tuple[Any, int],
             site: Any) -> bool:
    """Whether the rank went from that line to `site` every earlier time too, where most went elsewhere: its part
    of the program (a first stage, which has no stage to send its gradient to, receives the next one at once)."""
    earlier = [(point[0], n) for n in range(1, point[1]) if (point[0], n) in mine]
    return bool(earlier) and all(mine[p] == site and turns[p].most_common(1)[0][0] != site for p in earlier)


def _reordered_turn(states: list[RankState], r: int, held: CallBegun, point: tuple[Any, int], common: Any,
                    minority: set[int]) -> Cause | None:
    """Rank r's cause where its line is its own (no rank that went the others' way made a call there): it made
    that call first, where the others go on to theirs, the two in another order (a writer's barrier before the
    pair all_reduce, a loss report sent before the backward)."""
    if not reached_only_by(states, held.site, minority):
        return None
    return Cause(r, KINDS["reordered"], (
        f"rank {r} waits in {held.kind} #{held.seq} at {site_text(held.site)}, a line of its own, where after their "
        f"call #{point[1]} at {site_text(point[0])} the others went on to {site_text(common)} and completed it: it "
        "makes its call there first, in another order than theirs"), held.group, held.seq)


def mispaired(states: list[RankState], held: dict[int, CallBegun],
              members: dict[str, tuple[int, ...]]) -> dict[int, Cause]:
    """A call on a pair that completed with a call from a line its own line never pairs with elsewhere (a last stage
    whose extra eval forward takes the training activation its neighbour sends): of the two, the rank that made one
    call more at its line than any other rank that calls there added it; from there on the two are a call apart."""
    pairs: Counter[tuple[Any, Any]] = Counter()
    seen: list[tuple[str, int, tuple[int, int], tuple[Any, Any]]] = []
    for group, ranks in members.items():
        if len(ranks) != 2 or channel_ends(group) is not None or any(r >= len(states) for r in ranks):
            continue
        a, b = (states[r] for r in ranks)
        for q in range(min(a.calls_on.get(group, 0), b.calls_on.get(group, 0))):
            if (group, q) in a.call_log and (group, q) in b.call_log:
                lines = (a.call_log[(group, q)][0], b.call_log[(group, q)][0])
                pairs[lines] += 1
                seen.append((group, q, (a.rank, b.rank), lines))
    made: Counter[tuple[int, Any]] = Counter((s.rank, site) for s in states for site, _ in s.call_log.values())
    found: dict[int, Cause] = {}
    for group, q, ranks, lines in seen:
        if pairs[lines] * 2 > min(_usual(pairs, lines, 0), _usual(pairs, lines, 1)):
            continue  # a pairing of these two lines is no rarer than each line's usual one
        for r, line in zip(ranks, lines):
            others = Counter(n for (rank, site), n in made.items() if site == line and rank not in ranks)
            if not others or r in found:
                continue
            usual, most = others.most_common(1)[0]
            if made[(r, line)] > usual and 2 * sum(n for count, n in others.items() if count > usual) < most:
                found[r] = Cause(r, KINDS["mismatched"], (
                    f"rank {r} added a call the others do not make: its call #{q} on its pair {group_text(ranks)} at "
                    f"{site_text(line)}, its call #{made[(r, line)]} there where the other ranks that call there made "
                    f"{usual}, completed with rank {_other(ranks, r)}'s call at "
                    f"{site_text(lines[1 - ranks.index(r)])}, which pairs with another line everywhere else"),
                    group, q)
    return found if found and 2 * len(found) < len(states) else {}


def _usual(pairs: Counter[tuple[Any, Any]], lines: tuple[Any, Any], side: int) -> int:
    """How often the line on `side` of a pairing pairs with the line it pairs with most."""
    return max(n for other, n in pairs.items() if other[side] == lines[side])


def _other(ranks: tuple[int, int], r: int) -> int:
    return ranks[1] if ranks[0] == r else ranks[0]


def one_more_on_a_link(states: list[RankState], held: dict[int, CallBegun],
                       members: dict[str, tuple[int, ...]], order: StateOrder) -> dict[int, Cause]:
    """A rank held on a link (a group of two no mesh dim made) in a call its partner never made, the partner gone
    on to a call elsewhere, where the rank made one call more on the link than the partner, and on the links
    between ranks as far apart that no rank waits on, each member made as many as this partner: it added a call (a
    stage that sends its gradient on its downstream link, where its partner had received from it and sent its
    own)."""
    pairs = {g: ranks for g, ranks in members.items() if len(ranks) == 2 and order.roles.get(g) is None}
    waited = {c.group for c in held.values()}
    done: dict[int, Counter[int]] = {}  # how far apart the two are -> how many calls each member made
    for g, ranks in pairs.items():
        counts = [states[m].calls_on.get(g, 0) for m in ranks if m < len(states)]
        if g not in waited and len(counts) == 2 and all(counts):
            done.setdefault(abs(ranks[1] - ranks[0]), Counter()).update(counts)
    found: dict[int, Cause] = {}
    for r, call in sorted(held.items()):
        link = pairs.get(call.group)
        if link is None or call.seq is None or not done.get(abs(link[1] - link[0])):
            continue
        usual = done[abs(link[1] - link[0])].most_common(1)[0][0]
        p = _other(link, r)
        theirs = held.get(p)
        if theirs is None or theirs.group == call.group or states[p].calls_on.get(call.group, 0) != usual \
                or states[r].calls_on.get(call.group, 0) != usual + 1:
            continue
        found[r] = Cause(r, KINDS["mismatched"], (
            f"rank {r} added a call on its pair {group_text(call.ranks)}: {call.kind} #{call.seq} at "
            f"{site_text(call.site)}, one call more than its partner {p} made there before it went on to "
            f"{theirs.kind} #{theirs.seq} on group {group_text(theirs.ranks)}; on the pairs no rank waits on, each "
            f"member made as many calls as rank {p}"), call.group, call.seq)
    return found
