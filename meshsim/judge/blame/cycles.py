"""Waits that form a cycle: every rank waits for another that waits in turn.

A correct program does not deadlock, so some call in the cycle does not fit the program. Pipelines (broadcasts on
pair groups, send/recv) wait around a cycle by design until one stage breaks the pattern: the culprit is the rank
whose call does not fit what the other ranks do at that line (the part, or the peer, it calls with), not the whole
cycle. Calls made in different orders (a rank that takes two groups' calls the other way round) break the program
order most ranks follow. Where neither tells, the evidence cannot decide: the cycle's ranks are candidates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ...core.outcome import KINDS
from ...core.ranks import group_text, ranks_text
from ...core.record import RankState
from ...core.wire import CallBegun, channel_ends
from .calls import Cause, between, reached_only_by, site_text
from .parts import StateOrder
from .pipelines import lone_channels, mispaired, off_the_common_turn, one_more_on_a_link

PARTS = ("dim", "siblings")  # the parts several groups play (meshsim.judge.blame.parts.roles_of)


def cycle_causes(states: list[RankState], order: StateOrder, held: dict[int, CallBegun],
                 upstream: dict[int, set[int]], divergent: set[int]) -> dict[int, Cause]:
    """The ranks of a cycle of waits whose call breaks the pattern (off_pattern), else the program order
    (by_order)."""
    return off_pattern(states, order, held, upstream) or by_order(order, held, upstream, divergent)


def off_pattern(states: list[RankState], order: StateOrder, held: dict[int, CallBegun],
                upstream: dict[int, set[int]]) -> dict[int, Cause]:
    """Ranks in the cycle (or, where whom they wait for is not known, the held ranks that others wait for) whose
    held call, made at a line where most ranks that made it call on one kind of group,
    calls on another: a receive from the wrap-around peer where every other stage receives from the stage before
    it. A kind of group is a part several groups play (a mesh dim, sibling groups: the same for every rank), else
    the group's relation to the rank: its peer (a channel's ends, a pair's other member), or, where a group's
    members are not known (gloo's dumps name none), its place among the rank's own groups (torch's pg_id: the
    group with the stage before it is each middle stage's first)."""
    cycle = _in_cycle(upstream)
    if not cycle:  # whom the held ranks wait for is not known (a group's other members): the ranks waited for
        cycle = {m for ranks in upstream.values() for m in ranks if m in held}
    members = _members(states, held)
    crossing = crossing_channels(states, held, members, order.roles)
    if crossing:
        return crossing
    shapes: list[Callable[[int, str], Any]] = [lambda r, g: _shape(r, g, members, order)]
    if any(_shape(r, held[r].group, members, order)[0] == "group" for r in cycle if r in held):
        shapes.append(lambda r, g: _nth(states, r, g, order))  # (only where whom a call is with is not known)
    for shape in shapes:
        found = _odd_ones(states, held, cycle, shape, order.roles)
        if found and len(found) < len(cycle):
            return found
    return lone_channels(states, held) or silent_links(states, held, members) or \
        odd_link_order(states, held, members) or \
        crossed_pair(states, held, members) or mispaired(states, held, members) or \
        one_more_on_a_link(states, held, members, order) or off_the_common_turn(states, held, order) or \
        _odd_stages(held, cycle, {r: _peer(r, held[r].group, members) for r in cycle if r in held})


def crossing_channels(states: list[RankState], held: dict[int, CallBegun], members: dict[str, tuple[int, ...]],
                      roles: dict[str, Any]) -> dict[int, Cause]:
    """Ranks held on a point-to-point channel that crosses the groups of a part (a mesh dim, sibling groups) which
    the run's other channels stay within, and on which no other rank ever called: a ring that runs on each host's
    cp group, whose first rank receives from the world's previous rank. That rank named the wrong peer; the ring's
    rank that sends to it, and waits, calls as the program does."""
    called: dict[str, set[int]] = {}
    ends: dict[str, tuple[int, int]] = {}
    for rank, group in [(s.rank, g) for s in states for g, _ in s.call_log] + [(-1, c.group) for c in held.values()]:
        channel = channel_ends(group)
        if channel is not None:
            ends[group] = channel[:2]
            called.setdefault(group, set()).update({rank} if rank >= 0 else set())
    for where in _partitions(members, roles):
        crossing = {c for c in called if len({where.get(end, -1 - end) for end in ends[c]}) > 1}
        if not crossing or 4 * len(crossing) > len(called):
            continue
        found = {r: Cause(r, KINDS["mismatched"], (
            f"rank {r} waits in {call.kind} #{call.seq} {between(r, call.group)}, a channel that crosses the groups "
            f"every other channel of the run stays within ({len(called) - len(crossing)} of {len(called)}), and on "
            f"which no other rank ever called: it named a peer outside its group"), call.group, call.seq)
            for r, call in sorted(held.items()) if call.group in crossing and called[call.group] <= {r}}
        if found:
            return found
    return {}


def _partitions(members: dict[str, tuple[int, ...]], roles: dict[str, Any]) -> list[dict[int, int]]:
    """Each part played by two groups or more that share no rank: rank -> the index of its group there."""
    parts: dict[Any, list[tuple[int, ...]]] = {}
    for group, role in roles.items():
        if role[0] in PARTS and group in members:
            parts.setdefault(role, []).append(members[group])
    out = []
    for groups in parts.values():
        groups = sorted(set(groups))
        where = {r: i for i, g in enumerate(groups) for r in g}
        if len(groups) >= 2 and len(where) == sum(len(g) for g in groups):
            out.append(where)
    return out


def silent_links(states: list[RankState], held: dict[int, CallBegun],
                 members: dict[str, tuple[int, ...]]) -> dict[int, Cause]:
    """A stage that never called on one of its links (a group of two) while its partner waits there, though every
    other rank with links at the same offsets calls on its link at that offset and this one calls on its others:
    it does not take that part of the pipeline (the first stage of a host receiving on its downstream link, not
    its upstream one). Its partner, and the ranks behind, wait as they should."""
    links = _links(states, members)
    called = {r: {g for g, _ in states[r].call_log} for r in links if r < len(states)}
    alike: dict[frozenset[int], list[int]] = {}  # the ranks with links at the same offsets
    for r in called:
        alike.setdefault(frozenset(links[r]), []).append(r)
    found: dict[int, Cause] = {}
    for w, call in sorted(held.items()):
        ranks = members.get(call.group, call.ranks)
        if len(ranks) != 2 or w not in ranks:
            continue
        m = next(r for r in ranks if r != w)
        offset = w - m
        if m not in called or m in found or call.group in called[m] or links[m].get(offset) != call.group or \
                not called[m] & set(links[m].values()):
            continue
        peers = [p for p in alike[frozenset(links[m])] if p != m]
        if len(peers) >= 2 and all(links[p][offset] in called[p] for p in peers):
            found[m] = Cause(m, KINDS["mismatched"], (  # (it called on another link where its peers call here)
                f"rank {m} never called on its link {group_text(ranks)} (with the rank {offset:+d} from it), where "
                f"ranks {ranks_text(peers)} call on theirs at that offset, and it calls on its other links: rank {w} "
                f"waits for it in {call.kind} #{call.seq} there"), call.group, call.seq)
    return found


def odd_link_order(states: list[RankState], held: dict[int, CallBegun],
              members: dict[str, tuple[int, ...]]) -> dict[int, Cause]:
    """A stage whose calls on one of its links come in another order than every other stage's on its link at
    that offset: its first call there receives where theirs send (it sent on another link). A call is known by its
    root, read from the rank as an offset (0: itself), else (gloo's dumps record no root) by its line, which must
    be one the other stages reach at another place of that link (a stage's own line, as the last encoder's send,
    is its own code, not another order). Its partner and the ranks behind wait as they should."""
    links = _links(states, members)
    found: dict[int, Cause] = {}
    for r, mine in sorted(links.items()):
        for offset, group in sorted(mine.items()) if r < len(states) else ():
            peers = [p for p in links if p != r and p < len(states) and _same_end(mine, links[p], offset)]
            theirs = [(_link_calls(states[p], links[p][offset]), _held_at(held, p, links[p][offset])) for p in peers]
            odd = _odd_place(_link_calls(states[r], group), _held_at(held, r, group), theirs)
            if odd is not None:
                found[r] = _odd_call(r, group, members.get(group, ()), odd, held)
                break
    return found if found and 2 * len(found) < len(links) and set(found) & _waited_for(held) else {}


def crossed_pair(states: list[RankState], held: dict[int, CallBegun],
                 members: dict[str, tuple[int, ...]]) -> dict[int, Cause]:
    """Both members of a pair held in the same call of it, which does not complete: the two calls do not match
    (a broadcast with two roots; gloo's dumps record no root). Where one member makes it at a line at which no call
    of the run ever completed, and its partner at a line whose call completed on this very pair before (a stage
    sending on the wrong link, its neighbour sending the next gradient as it did the last), the first is off the
    pattern; the partner repeats a step the link ran, or makes the call the other stages make there (held at that
    line on their own pairs)."""
    completed = {site for s in states for (group, q), (site, _) in s.call_log.items()
                 if site is not None and _held_at(held, s.rank, group) != q}
    found: dict[int, Cause] = {}
    for r, call in sorted(held.items()):
        ranks = members.get(call.group, call.ranks)
        partner = next((m for m in ranks if m != r), None) if len(ranks) == 2 and r in ranks else None
        if partner is None or partner >= len(states) or _held_at(held, partner, call.group) != call.seq:
            continue
        mine = states[r].call_log.get((call.group, call.seq), (None, None))[0]
        theirs = states[partner].call_log.get((call.group, call.seq), (None, None))[0]
        ran_here = any(site == theirs for (group, q), (site, _) in states[partner].call_log.items()
                       if group == call.group and q < call.seq)
        if mine is None or theirs is None or mine == theirs or mine in completed:
            continue
        if ran_here or _the_others_line(states, theirs, mine, {r, partner}):
            why = "whose call completed on this pair before" if ran_here else \
                f"at which other ranks call too, where no other rank called at rank {r}'s"
            found[r] = Cause(r, KINDS["mismatched"], (
                f"rank {r} waits in {call.kind} #{call.seq} on its pair {group_text(ranks)} at {site_text(mine)}, a "
                f"line at which no call of the run ever completed, while rank {partner} waits with it in that very "
                f"call at {site_text(theirs)}, a line {why}: the two calls do not match (two roots of a broadcast, "
                f"say), and rank {r}'s is off the pattern"), call.group, call.seq)
    return found if found and 2 * len(found) < len(states) else {}


def _the_others_line(states: list[RankState], theirs: Any, mine: Any, pair: set[int]) -> bool:
    """Whether two ranks or more outside the pair made a call at the partner's line (held or completed), and none at
    the rank's (every middle stage held in its first backward receive, where one stage receives at a line of its
    own)."""
    callers = {s.rank for s in states if s.rank not in pair for site, _ in s.call_log.values() if site == theirs}
    return len(callers) >= 2 and reached_only_by(states, mine, pair)


def _same_end(mine: dict[int, str], theirs: dict[int, str], offset: int) -> bool:
    """Two ranks play the same end of their links at `offset` (a stage's downstream link): their links are at the
    same offsets, or but one the other way round (a replica's image in a 3-D mesh of pairs: its dp partner above
    where ours is below)."""
    if offset not in theirs:
        return False
    differ = set(mine) ^ set(theirs)
    return not differ or (len(differ) == 2 and sum(differ) == 0 and offset not in differ)


def _link_calls(state: RankState, group: str) -> list[tuple[Any, int | None]]:
    """The rank's calls on a group, in order: (line, root as an offset from the rank, None where unknown)."""
    out = []
    for q in range(state.calls_on.get(group, 0)):
        root = state.roots.get((group, q))
        out.append((state.call_log.get((group, q), (None, None))[0], None if root is None else root - state.rank))
    return out


def _held_at(held: dict[int, CallBegun], rank: int, group: str) -> int | None:
    call = held.get(rank)
    return call.seq if call is not None and call.group == group else None


def _odd_place(ours: list[tuple[Any, int | None]], held_at: int | None,
               theirs: list[tuple[list[tuple[Any, int | None]], int | None]]) -> Any:
    """(place, our call, theirs) where ours departs from what at least two other stages agree on there, or from
    the one other stage's (two pipelines: the same stage of the other) where ours is held and theirs went through."""
    for i, (site, root) in enumerate(ours):
        voters = [(t[i], their_held) for t, their_held in theirs if len(t) > i and t[i][0] is not None]
        there = {call for call, _ in voters}
        alone = len(voters) == 1 and i == held_at and voters[0][1] != i
        if (len(voters) < 2 and not alone) or len(there) != 1 or site is None:
            continue
        usual = next(iter(there))
        if root is not None and usual[1] is not None:
            if root != usual[1]:
                return i, (site, root), usual
        elif site != usual[0] and any(site == c[0] for t, _ in theirs for k, c in enumerate(t) if k != i):
            return i, (site, root), usual
    return None


def _waited_for(held: dict[int, CallBegun]) -> set[int]:
    return {m for r, call in held.items() for m in call.ranks if m != r}


def _odd_call(r: int, group: str, ranks: tuple[int, ...], odd: Any, held: dict[int, CallBegun]) -> Cause:
    i, (site, root), (usual_site, usual_root) = odd
    link = group_text(ranks)
    waiting = sorted(w for w, call in held.items() if w != r and tuple(call.ranks) == tuple(ranks))
    if root is not None and usual_root is not None:
        how = (f"takes its root from {_whom(root, 'it')} where the other stages' call there on their link at that "
               f"offset takes it from {_whom(usual_root, 'them')}")
    else:
        how = (f"is made at {site_text(site)}, a line the other stages reach later on their link at that offset, "
               f"where they make theirs at {site_text(usual_site)}")
    return Cause(r, KINDS["mismatched"], (
        f"rank {r}'s call #{i} on its link {link} {how}: it made that link's calls in another order (or one on "
        f"another link)" + (f"; rank {ranks_text(waiting)} waits for it there" if waiting else "")), group, i)


def _whom(offset: int, pronoun: str) -> str:
    return "itself" if offset == 0 and pronoun == "it" else "themselves" if offset == 0 else \
        f"the rank {offset:+d} from {pronoun}"


def _links(states: list[RankState], members: dict[str, tuple[int, ...]]) -> dict[int, dict[int, str]]:
    """Each rank's groups of two, by the offset of the other member from it (a pipeline stage's links)."""
    out: dict[int, dict[int, str]] = {}
    for group, ranks in members.items():
        if len(ranks) == 2 and channel_ends(group) is None:
            a, b = ranks
            out.setdefault(a, {})[b - a] = group
            out.setdefault(b, {})[a - b] = group
    return out


def _odd_stages(held: dict[int, CallBegun], cycle: set[int], shapes: dict[int, Any]) -> dict[int, Cause]:
    """A pipeline whose stages wait at different lines (the first stage, by the bug, at a line the others do not
    reach): where most of the cycle's ranks wait with a peer at one offset (each stage receives from the one before)
    and a minority with another (the first stage, from the wrap-around peer), the minority broke the pattern.
    Only where every held call of the cycle is between two ranks (`shapes`: their peers, _peer)."""
    if not shapes or any(shape is None for shape in shapes.values()):
        return {}
    counts = Counter(shapes.values()).most_common()
    usual, most = counts[0]
    if len(counts) < 2 or most * 2 <= len(shapes) or counts[1][1] == most:
        return {}
    others = sorted(r for r, shape in shapes.items() if shape == usual)
    found: dict[int, Cause] = {}
    for r, shape in sorted(shapes.items()):
        if shape != usual:
            call = held[r]
            found[r] = Cause(r, KINDS["reordered"], (
                f"rank {r} waits in {call.kind} #{call.seq} on group {group_text(call.ranks)} at "
                f"{site_text(call.site)}, {_said(shape)}, where ranks {ranks_text(others)} of the cycle wait "
                f"{_said(usual)}: the one stage that waits on another peer (a first stage receiving from the "
                f"wrap-around one, where every other stage receives from the stage before it), and ranks "
                f"{ranks_text(sorted(cycle - {r}))} wait behind it"), call.group, call.seq)
    return found


def _odd_ones(states: list[RankState], held: dict[int, CallBegun], cycle: set[int],
              shape: Callable[[int, str], Any], roles: dict[str, Any]) -> dict[int, Cause]:
    made: dict[tuple[Any, str], dict[Any, set[int]]] = {}  # (site, kind) -> the kinds of group it was made on -> ranks
    for s in states:
        for (group, _), (site, kind) in s.call_log.items():
            if site is not None:
                made.setdefault((site, kind), {}).setdefault(shape(s.rank, group), set()).add(s.rank)
    found: dict[int, Cause] = {}
    for r in sorted(cycle):
        call = held[r]
        seen = made.get((call.site, call.kind), {}) if call.site is not None else {}
        top = sorted(((len(ranks), shape) for shape, ranks in seen.items()), key=lambda t: (t[0], repr(t[1])),
                     reverse=True)
        counts = Counter(n for n, _ in top)
        mine = shape(r, call.group)
        if not top or counts[top[0][0]] > 1 or top[0][0] < 2 or top[0][1] == mine or \
                _no_such_place(states[r], top[0][1]):
            continue
        usual, others = top[0][1], sorted(seen[top[0][1]])
        text = (f"rank {r} waits in {call.kind} #{call.seq} on group {group_text(call.ranks)} at "
                f"{site_text(call.site)}, {_said(mine)}, where rank{'s' if len(others) > 1 else ''} "
                f"{ranks_text(others)} call there {_said(usual)}: its call does not fit the pattern its siblings "
                f"follow, and ranks {ranks_text(sorted(cycle - {r}))} wait behind it")
        if usual[0] in PARTS and mine[0] in (*PARTS, "group"):  # not the part its siblings call on: the wrong group
            waited = _waited_on(states, held, r, {g for g, role in roles.items() if role == usual}) or call
            found[r] = Cause(r, KINDS["mismatched"], text + (
                f"; its peers wait for it in {waited.kind} #{waited.seq} on group {group_text(waited.ranks)}"
                if waited is not call else ""), waited.group, waited.seq)
        else:  # another peer: a stage of a cycle
            found[r] = Cause(r, KINDS["reordered"], text, call.group, call.seq)
    return found


def _no_such_place(state: RankState, usual: Any) -> bool:
    """Whether the rank is a member of fewer groups than the place its siblings call at (a first stage's one
    link is its first group, where the middle stages' upstream link is their second): not a departure."""
    return bool(usual[0] == "nth" and usual[1] > max(state.group_index.values(), default=0))


def _waited_on(states: list[RankState], held: dict[int, CallBegun], r: int, wanted: set[str]) -> CallBegun | None:
    """A call that other ranks wait in for rank r, on one of the groups `wanted` (where its peers call)."""
    for rank, call in sorted(held.items()):
        if rank != r and r in call.ranks and call.group in wanted and states[r].calls_on.get(call.group, 0) <= call.seq:
            return call
    return None


def _in_cycle(upstream: dict[int, set[int]]) -> set[int]:
    """The ranks on some cycle of waits (each waits for the next, the last for the first): every cycle, not the
    first one found, since sibling groups that hang alike (each with its own culprit) wait in cycles that share
    ranks. networkx (which torch installs) finds the strongly connected components."""
    import networkx as nx  # here: only a hang's diagnosis needs it

    graph = nx.DiGraph([(rank, m) for rank, ranks in upstream.items() for m in ranks])
    return {rank for component in nx.strongly_connected_components(graph) for rank in component
            if len(component) > 1 or graph.has_edge(rank, rank)}


def _members(states: list[RankState], held: dict[int, CallBegun]) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for s in states:
        out.update(s.created)
    for call in held.values():
        out.setdefault(call.group, tuple(call.ranks))
    return out


def _shape(rank: int, group: str, members: dict[str, tuple[int, ...]], order: StateOrder) -> Any:
    """What kind of group a rank calls on, as its siblings would call on theirs: a part that several groups play
    (a mesh dim, sibling groups) by its name; a point-to-point channel by its ends, and a group of two by its
    other member, relative to the rank; any other group by itself."""
    role = order.roles.get(group)
    if isinstance(role, tuple) and role[0] in PARTS:
        return role
    return _peer(rank, group, members) or ("group", group)


def _peer(rank: int, group: str, members: dict[str, tuple[int, ...]]) -> Any:
    """Whom a rank waits with on a point-to-point channel or a group of two, relative to it (None: a larger group)."""
    ends = channel_ends(group)
    if ends is not None:
        return ("channel", ends[0] - rank, ends[1] - rank)
    ranks = members.get(group)
    if ranks is not None and len(ranks) == 2 and rank in ranks:
        return ("pair", next(m for m in ranks if m != rank) - rank)
    return None


def _nth(states: list[RankState], rank: int, group: str, order: StateOrder) -> Any:
    role = order.roles.get(group)
    if isinstance(role, tuple) and role[0] in PARTS:
        return role
    index = states[rank].group_index.get(group)
    return ("nth", index) if index is not None else ("group", group)


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def _said(shape: Any) -> str:
    kind = shape[0]
    if kind == "nth":
        return f"on the {_ordinal(shape[1])} group it is a member of (in the order they were made)"
    if kind == "dim":
        return f"on mesh dim {shape[1]!r}"
    if kind == "siblings":
        return "on its own group of the sibling groups"
    if kind == "channel":
        return f"from the rank {shape[1]:+d} from it" if shape[2] == 0 else f"to the rank {shape[2]:+d} from it"
    if kind == "pair":
        return f"with the rank {shape[1]:+d} from it"
    return f"on group {shape[1]}"


def by_order(order: StateOrder, held: dict[int, CallBegun], upstream: dict[int, set[int]],
             divergent: set[int]) -> dict[int, Cause]:
    """Calls made in different orders. The ranks whose held call breaks the majority's program order are to
    blame. Where no rank made both calls (two ranks took a step's two calls in the other order: each side holds
    only its own), the call more ranks wait in is the program's next one, and the fewer ranks that wait in the
    other parted from it; with no majority either, the plan's divergent ranks, else the evidence cannot decide and
    every rank of the cycle is a candidate."""
    blamed: dict[int, Cause] = {}
    waiting = Counter(order.key(c.group, c.seq) for c in held.values())
    for rank, call in held.items():
        for m in upstream.get(rank, ()):
            theirs = held.get(m)
            if theirs is None:
                continue
            mine_key, their_key = order.key(call.group, call.seq), order.key(theirs.group, theirs.seq)
            first = order.precedes(their_key, mine_key)
            if first is False or (first is None and waiting[their_key] > waiting[mine_key]):
                continue
            undecided = first is None and waiting[their_key] == waiting[mine_key]
            text = (f"rank {m} waits in {theirs.kind} #{theirs.seq} on group {group_text(theirs.ranks)} while rank "
                    f"{rank} waits for it in {call.kind} #{call.seq} on group {group_text(call.ranks)}: the two make "
                    "these calls in opposite orders" + (", and nothing tells which order the program's is"
                                                        if undecided else ""))
            if m not in blamed or (blamed[m].candidate and not undecided):
                blamed[m] = Cause(m, KINDS["reordered"], text, call.group, call.seq, candidate=undecided)
    if divergent & set(blamed):
        blamed = {r: Cause(c.rank, c.kind, c.text, c.group, c.seq) for r, c in blamed.items() if r in divergent}
    return blamed
