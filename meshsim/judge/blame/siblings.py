"""Siblings decide, and counts come before order.

SPMD code makes the same calls on every group of one part (every group of a mesh dim, every group of one
new_subgroups or enumeration call): where the members of one group made different calls at one position, the groups
of its part elsewhere say which call the program makes there, and so who departs from it. A group of two members,
or with no majority, cannot decide alone; a group's majority that departs from what every sibling does is not the
program either (each host's local rank 0 adding a call leaves three members of each tp group that look like they
skipped one).

A rank with one call more or one call fewer on a group than its peers make is the culprit, whichever side waits:
where members finished without a call that the others wait in, and the part's other ranks finished without it too,
the ranks that wait added it; where the calls alternate (A B A B), so that a rank's call looks like the next one
and its next like this one, its count against its siblings' tells a call fewer from one more.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...core.outcome import KINDS
from ...core.ranks import group_text, ranks_text
from ...core.record import RankState
from ...core.wire import FINISHED, CallBegun
from .calls import Cause, held_in, own_line, reached_only_by, site_text
from .parts import Reference

AMBIGUOUS = object()  # a departure that fits a skip and an added call equally: the group's own evidence decides


def by_siblings(states: list[RankState], ref: Reference, call: CallBegun, seq: int,
                camps: dict[Any, list[int]]) -> list[Cause] | None:
    """The members of `call`'s group made the calls `camps` ((site, kind) -> ranks) at position seq: the camps that
    depart from what the part's other groups make there, each member with what it did. None where the siblings
    cannot say (none got there, they disagree, or no camp or several make their call)."""
    part = ref.part(call.group)
    members = [m for m in call.ranks if m < len(states)]
    program = ref.program(part, seq, exclude=members)
    if program is None:
        return None
    # the same call, else from the same line through another caller of a helper (a stage's forward and another's
    # backward both call the tp all_reduce's helper), else the same kind of call
    matching = [e for e in camps if e == program] or \
        [e for e in camps if (_line(e[0]), e[1]) == (_line(program[0]), program[1])] or \
        [e for e in camps if e[1] == program[1]]
    if len(matching) != 1:
        return None
    after = ref.program(part, seq + 1, exclude=members)
    causes = []
    for entry, ranks in sorted(camps.items(), key=repr):
        if entry == matching[0]:
            continue
        for r in ranks:
            cause = _departure(ref, part, call, seq, entry, r, (program, after), members)
            if cause is AMBIGUOUS:
                return None
            if isinstance(cause, Cause):
                causes.append(cause)
    return causes


def _line(site: Any) -> Any:
    """The user's line a call was made at, without the helper's caller (meshsim.core.record.name_helper_calls)."""
    return site.split(" via ", 1)[0] if isinstance(site, str) else site


def _alike(a: Any, b: Any) -> bool:
    """Two (site, kind) entries are the same call: made at one line, whichever caller of a helper made it."""
    return a == b or (a is not None and b is not None and (_line(a[0]), a[1]) == (_line(b[0]), b[1]))


def _departure(ref: Reference, part: Any, call: CallBegun, seq: int, entry: Any, r: int,
               program: tuple[Any, Any], members: list[int]) -> Any:
    """How rank r's call `entry` at position seq departs from the program's (its call there, and the next); None
    where it is the program's own branch (the same call from another line)."""
    here, after = program
    group = f"group {group_text(call.ranks)}"
    peers = f"its peers on {ref.describe(part)}"
    inserted = _alike(ref.entry(r, part, seq + 1), here)
    skipped = after is not None and _alike(entry, after)
    if inserted and skipped:  # calls that alternate (A B A B): one call fewer or one more, counts tell
        mine, theirs = ref.count(r, part), ref.counts(part, exclude=members).most_common(1)
        if mine is None or not theirs or mine == theirs[0][0]:
            return AMBIGUOUS
        inserted, skipped = mine > theirs[0][0], mine < theirs[0][0]
    if inserted:
        return Cause(r, KINDS["mismatched"], f"rank {r} added a call the others do not make: {entry[1]} #{seq} on "
                     f"{group} at {site_text(entry[0])}; {peers} make {here[1]} there (at {site_text(here[0])}), "
                     "which is its next call", call.group, seq)
    if skipped and entry[1] != here[1] and held_in(ref.states[r], call.group, seq):
        # held in that very call: whether it skipped the first or makes it after, nothing it did yet tells
        return Cause(r, KINDS["reordered"], f"rank {r} made {entry[1]} #{seq} on {group} at {site_text(entry[0])} "
                     f"where {peers} make {here[1]} first and {entry[1]} next: it makes them in another order (or "
                     "skipped the first)", call.group, seq)
    if skipped:
        return Cause(r, KINDS["skipped"], f"rank {r} skipped {here[1]} #{seq} on {group} (made at "
                     f"{site_text(here[0])}): its call there is the one {peers} make next", call.group, seq)
    if after is not None and entry[1] == after[1]:
        return Cause(r, KINDS["reordered"], f"rank {r} made {entry[1]} #{seq} on {group} at {site_text(entry[0])} "
                     f"where {peers} make {here[1]} first and {after[1]} next: it makes them in another order",
                     call.group, seq)
    if entry[1] == here[1]:
        return None
    return Cause(r, KINDS["mismatched"], f"rank {r} made {entry[1]} #{seq} on {group} at {site_text(entry[0])} "
                 f"where {peers} make {here[1]}", call.group, seq)


def ended_without(states: list[RankState], ref: Reference, call: CallBegun, inside: set[int],
                  gone: list[int]) -> bool:
    """Whether the program has no call at `call`'s position: more of the ranks that play its part finished
    without one (its members that finished, and the part's other ranks) than made one."""
    part = ref.part(call.group)
    without = with_ = 0
    for r in ref.ranks(part, exclude=call.ranks):
        count = ref.count(r, part) or 0
        if count > call.seq:
            with_ += 1
        elif states[r].end == FINISHED:
            without += 1
    return len(gone) + without > len(inside) + with_


def added_alone(states: list[RankState], ref: Reference, held: dict[int, CallBegun]) -> dict[int, Cause]:
    """Counts against siblings, where nothing else explains the waits: a minority of a part's ranks held in a call
    on its groups, where every other rank of the part (its sibling groups' too) made fewer calls there and went on
    or finished, made one call more than their peers: an evaluation all_reduce under `if rank == 1` followed by a
    barrier every rank makes. (Where the part is one group, or none of its other ranks called on it yet, ranks that
    take two groups' calls in another order look the same: the cycle rule says so.)"""
    found: dict[int, Cause] = {}
    for site in sorted({c.site for c in held.values() if c.site is not None}, key=repr):
        inside = {r for r, c in held.items() if c.site == site}
        alone = reached_only_by(states, site, inside)
        for r in sorted(inside):
            call = held[r]
            part = ref.part(call.group)
            ranks = ref.ranks(part)
            # (a minority of the part, unless the rank made more calls than the part usually did, one at a line
            # of its own: ranks held at its line behind another culprit do not make it the program's)
            extra = ref.made_more(r, part, exclude=inside) and own_line(states, r) and not any(
                ref.made_more(m, part, exclude=inside) for m in inside & set(ranks) if m != r)
            if len({ref.group_of[part][m] for m in ranks}) < 2 or (2 * len(inside & set(ranks)) >= len(ranks)
                                                                   and not extra):
                continue
            others = [m for m in ranks if m not in inside]
            if all((ref.count(m, part) or 0) <= call.seq for m in others) and \
                    not on_their_way(states, held, r, site):
                usual = ref.usual(part, exclude=inside) or 0
                found[r] = Cause(r, KINDS["mismatched"], (
                    f"rank {r} added a call the others do not make: {call.kind} #{call.seq} on group "
                    f"{group_text(call.ranks)} at {site_text(site)}{', a line no other rank reached,' if alone else ''}"
                    f" where its peers on {ref.describe(part)} made {usual} call{'s' if usual != 1 else ''} there and "
                    "went on"), call.group, call.seq)
    return found


def on_their_way(states: list[RankState], held: dict[int, CallBegun], r: int, site: Any) -> bool:
    """Whether a member that has not made rank r's call is held where the program goes on to the call's line next,
    in a call that does not wait for r (a tp rank 0 receiving what it then broadcasts to its partner, who waits in
    that broadcast already)."""
    call = held[r]
    if not isinstance(site, str):
        return False
    before = {c.site for m, c in held.items()
              if m in call.ranks and c.site != site and c.site is not None and r not in c.ranks}
    if not before:
        return False
    for s in states:
        sites = [s.call_log.get(key, (None, None))[0] for key in s.issued]
        if any(a in before and b == site for a, b in zip(sites, sites[1:])):
            return True
    return False


def added_off_the_path(states: list[RankState], held: dict[int, CallBegun]) -> dict[int, Cause]:
    """Where waits form a cycle that names more ranks than this: at most half the world held at a line no other
    rank reached (a whole replica that took a branch of its own), each waiting for members held on the program's
    common path (a line most of the world is held at, or one these ranks passed before), made a call the others
    do not make (an extra all_reduce on the world under `if leader`, one isend more than its peer receives); the
    rest of the cycle waits behind them."""
    world = len(states)
    found: dict[int, Cause] = {}
    held_at = Counter(c.site for c in held.values())
    for site in sorted({c.site for c in held.values() if c.site is not None}, key=repr):
        inside = {r for r, c in held.items() if c.site == site}
        if 2 * len(inside) > world or not reached_only_by(states, site, inside):
            continue
        passed = {entry[0] for r in inside for entry in states[r].call_log.values()}
        for r in sorted(inside):
            call = held[r]
            waited = [m for m in call.ranks if m < world and m not in inside]
            if waited and all((o := held.get(m)) is not None and o.site is not None
                              and (o.site in passed or 2 * held_at[o.site] > world) for m in waited):
                found[r] = Cause(r, KINDS["mismatched"], (
                    f"rank {r} added a call the others do not make: {call.kind} #{call.seq} on group "
                    f"{group_text(call.ranks)} at {site_text(site)}, a line no other rank reached, while ranks "
                    f"{ranks_text(waited)} it waits for are held where the others are"), call.group, call.seq)
    return found


def on_another_group(states: list[RankState], ref: Reference, held: dict[int, CallBegun],
                     causes: dict[int, Cause]) -> None:
    """A culprit that added a call on one part, made where its peers make the same call on another part that
    waits for it, called on another group than its peers (a call on the wrong mesh dim): its cause is said so, on
    the group its peers wait on (its partner that completed the call with it, and the ranks held up after, are
    waiting, each with why)."""
    for r, cause in list(causes.items()):
        if cause.group is None or cause.seq is None or cause.kind != KINDS["mismatched"] or \
                held_in(states[r], cause.group, cause.seq):  # (held in it: calls in another order, a cycle)
            continue
        made = states[r].call_log.get((cause.group, cause.seq))
        if made is None:
            continue
        position = _position(states[r], cause.group, cause.seq)
        for rank, call in sorted(held.items()):
            if r not in call.ranks or ref.part(call.group) == ref.part(cause.group) or \
                    states[r].calls_on.get(call.group, 0) > call.seq or call.kind != made[1]:
                continue
            there = states[rank].call_log.get((call.group, call.seq))
            if there is None or not (there[0] == made[0] or _position(states[rank], call.group, call.seq) == position):
                continue
            waiting = sorted(w for w, c in held.items() if (c.group, c.seq) == (call.group, call.seq))
            causes[r] = Cause(r, KINDS["mismatched"], (
                f"rank {r} made {made[1]} at {site_text(made[0])} on {ref.describe(ref.part(cause.group))} (group "
                f"{group_text(group_members(states, cause.group))}) where its peers make it on "
                f"{ref.describe(ref.part(call.group))}: rank{'s' if len(waiting) > 1 else ''} {ranks_text(waiting)} "
                f"wait{'' if len(waiting) > 1 else 's'} for it in {call.kind} #{call.seq} on group "
                f"{group_text(call.ranks)}"), call.group, call.seq)
            break


def _position(state: RankState, group: str, seq: int) -> int | None:
    """Where a call stands in the rank's own sequence of calls (its n-th call)."""
    try:
        return state.issued.index((group, seq))
    except ValueError:
        return None


def group_members(states: list[RankState], group: str) -> list[int]:
    """The ranks that called on a group or created it."""
    return sorted({s.rank for s in states if group in s.calls_on} |
                  {m for s in states for m in s.created.get(group, ())})


def added_not_skipped(states: list[RankState], ref: Reference, held: dict[int, CallBegun],
                      causes: dict[int, Cause]) -> None:
    """A rank said to have skipped a call because it waits in a later one did not skip it where its partners made
    that later call at another line and no rank but those held with it reached its line: it added that call (an
    image adapter's all_reduce on the cp group, which its cp partner's next all_gather meets), or made it on another
    group than the one its peers call at that point of their program (which the cause says)."""
    for m, cause in list(causes.items()):
        call = held.get(m)
        if cause.kind != KINDS["skipped"] or cause.candidate or call is None or call.site is None or \
                (cause.group, cause.seq) == (call.group, call.seq):
            continue
        there = {r for r, c in held.items() if c.site == call.site}
        theirs = [e for p in call.ranks if p < len(states) and p not in there
                  and (e := states[p].call_log.get((call.group, call.seq))) is not None]
        if not theirs or any(e[0] == call.site for e in theirs) or not reached_only_by(states, call.site, there):
            continue
        part = ref.part(call.group)
        text = (f"rank {m} added a call the others do not make: {call.kind} #{call.seq} on group "
                f"{group_text(call.ranks)} ({ref.describe(part)}) at {site_text(call.site)}, a line no other rank "
                f"reached, where its partners make {theirs[0][1]} (at {site_text(theirs[0][0])})")
        usual = _peers_call_there(states, ref, m, there)
        if usual is not None and usual[1] == call.kind and usual[2] != part:
            text += (f"; at this point of their program its peers make {usual[1]} on {ref.describe(usual[2])} (at "
                     f"{site_text(usual[0])}): it called on another group than theirs, or made a call they do not")
        causes[m] = Cause(m, KINDS["mismatched"], text, call.group, call.seq)


def _peers_call_there(states: list[RankState], ref: Reference, r: int, apart: set[int]) -> tuple[Any, str, Any] | None:
    """The call (site, kind, part) most ranks that made the same calls as rank r up to its held one make next,
    where r made its held call; None where none did."""
    mine = states[r].issued
    position = len(mine) - 1
    path = [(states[r].call_log.get(key, (None, None)), ref.part(key[0])) for key in mine[:position]]
    votes: Counter[tuple[Any, str, Any]] = Counter()
    for s in states:
        if s.rank in apart or len(s.issued) <= position:
            continue
        if [(s.call_log.get(key, (None, None)), ref.part(key[0])) for key in s.issued[:position]] != path:
            continue
        key = s.issued[position]
        site, kind = s.call_log.get(key, (None, "?"))
        votes[(site, kind, ref.part(key[0]))] += 1
    top = votes.most_common(1)
    return top[0][0] if top else None
