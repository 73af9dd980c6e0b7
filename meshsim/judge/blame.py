"""Who is to blame when a run does not finish: one rule for plans, user functions, scripts, torchrun and replays.

Culprits follow from the record (meshsim.core.record), not from who happens to be waiting:
- a rank that died, or raised outside any collective, is a culprit (but where it died in a collective whose
  members passed other tensor sizes, gloo killed whichever noticed: the odd sizes are to blame);
- a rank whose collective raised because a peer left is a victim of that peer;
- a rank stalled outside any collective that others wait for is a straggler, and a culprit;
- among the members of a group that others wait on, the rank whose sequence of calls there parts from the
  others' is the culprit: it issued fewer (it skipped, or left), more (an extra call), or another call at the
  first position where the members disagree. A rank that waits, or that completed a mismatched collective
  because its partner skipped one, is a victim, and the diagnosis says what it did. A rank waits in the call it
  is inside, else in its oldest call in flight (a Work not yet completed: DDP's buckets, async_op, isend, a
  functional collective); a point-to-point call is made on its channel (meshsim.core.wire.SENDS);
- ranks held in a call at a line that more members finished the script without ever reaching added it;
- a rank that finished without a call its part's other finished ranks made, while a partner has not got there
  yet, is a second culprit (the hang behind the first);
- a group created under different names on different ranks: the ranks with the earlier name skipped a new_group.
Sequences are compared by each call's site (a plan's step, a line of the user's code) and kind, so the answer
does not depend on timing, and the same hang gives the same culprits on every run. Where a group's members
split into camps of equal size, the sites tell who skipped (its next call is the others' current one), then the
plan's own divergence (when there is a plan), then the camp that stopped calling on the group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..core.ranks import group_text, ranks_text
from ..core.record import RankState, RunRecord
from ..core.wire import DIED, FINISHED, POINT_TO_POINT, RAISED, STUCK, CallBegun

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
    "unknown": "ranks waiting, cause unclear",
}


@dataclass
class Cause:
    """Why one rank is a culprit: the kind, in words, and the call of its group it missed or mismatched."""

    rank: int
    kind: str
    text: str
    group: str | None = None
    seq: int | None = None  # the call's position on its group, from 0

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "kind": self.kind, "group": self.group, "seq": self.seq, "text": self.text}


@dataclass
class Blame:
    """The kind of failure, its culprits with their causes (the most telling first), and what the others did."""

    kind: str
    culprits: list[int]
    note: str = ""
    victims: dict[int, str] = field(default_factory=dict)
    causes: list[Cause] = field(default_factory=list)


def _plainly(kind: str, ranks: list[int], states: list[RankState], note: str = "",
             victims: dict[int, str] | None = None) -> Blame:
    """A blame whose causes are where each culprit is."""
    return Blame(kind, ranks, note, victims or {}, [Cause(r, kind, f"rank {r} {states[r].where}") for r in ranks])


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


def blame(record: RunRecord, divergent: Iterable[int] = (), size_evidence: Iterable[int] = (),
          collided: Iterable[int] = ()) -> Blame:
    """The one rule (see the module's docstring). `divergent`: ranks a plan makes diverge (a tie-breaker only);
    `size_evidence`: ranks the model saw pass other tensor sizes to one collective; `collided`: ranks the model saw
    make different groups under one name (gloo crosses them: which ranks end up waiting, or abort, is a race, so
    the culprits are these, the same on every run)."""
    states = record.states
    crossed = sorted(set(collided))
    if crossed:
        held_now = {s.rank: c for s in states if (c := blocked_call(s)) is not None}
        return _plainly(KINDS["collision"], crossed, states, victims=_waiting_for(held_now, crossed))
    died = [s.rank for s in states if s.end == DIED]
    if died:
        return _sizes_parted(states, died) or _plainly(KINDS["dead"], died, states)
    left_outside = [s.rank for s in states if s.end == RAISED and s.failed_in is None]
    if left_outside:
        return _plainly(KINDS["raised"], left_outside, states)
    held = {s.rank: call for s in states if (call := blocked_call(s)) is not None}
    if not held:  # nobody waits in a call: the ranks still running past the deadline are the stragglers
        stalled = [s.rank for s in states if s.end == STUCK]
        return _plainly(KINDS["straggler"] if stalled else KINDS["unknown"], stalled, states)
    evidence = sorted(set(size_evidence))
    if evidence:
        return _plainly(KINDS["size"], evidence, states, victims=_waiting_for(held, evidence))
    if any(call.kind == "new_group" for call in held.values()):
        found = _creation(states, held)
        found.causes = [Cause(r, found.kind, f"rank {r} {states[r].where}") for r in found.culprits]
        return found
    return _collectives(states, held, set(divergent))


def _sizes_parted(states: list[RankState], died: list[int]) -> Blame | None:
    """A rank that died inside a collective whose members passed other tensor sizes: gloo aborts the process
    that notices (any of them), so the members that passed the odd sizes are to blame, whichever died."""
    for rank in died:
        call = states[rank].call
        if call is None or call.kind == "new_group":
            continue
        camps: dict[str, list[int]] = {}
        for m in call.ranks:
            size = states[m].sizes.get((call.group, call.seq)) if m < len(states) else None
            if size is not None:
                camps.setdefault(size, []).append(m)
        largest = max((len(r) for r in camps.values()), default=0)
        top = [size for size, ranks in camps.items() if len(ranks) == largest]
        if len(camps) < 2 or len(top) > 1:
            continue
        odd = sorted(m for size, ranks in camps.items() if size != top[0] for m in ranks)
        note = (f"Rank{'s' if len(odd) > 1 else ''} {ranks_text(odd)} passed "
                f"{' and '.join(size for size in camps if size != top[0])} to {call.kind} #{call.seq} on group "
                f"{group_text(call.ranks)} where the others passed {top[0]}; rank {rank} {states[rank].where}.")
        return Blame(KINDS["size"], odd, note, {}, [Cause(r, KINDS["size"], note, call.group, call.seq) for r in odd])
    return None


def _waiting_for(held: dict[int, CallBegun], culprits: list[int]) -> dict[int, str]:
    out = {}
    for rank, call in held.items():
        if rank not in culprits:
            out[rank] = f"waits in {call.kind} on group {group_text(call.ranks)}"
    return out


# ------------------------------------------------------------------------------------------ collectives


class ProgramOrder:
    """Which of two calls comes first in the program, by the majority of the ranks that made both.

    `sequences` holds each rank's calls in the order it issued them, each named by a key that every rank uses for
    the same call of the program: its group's role (every group of one mesh dim plays one part, as SPMD code
    makes them) and its position on the group. Ties, and no evidence: None.
    """

    def __init__(self, sequences: Iterable[list[Any]]):
        self.position = [{key: i for i, key in enumerate(keys)} for keys in sequences]
        self._cache: dict[tuple[Any, Any], bool | None] = {}

    def precedes(self, first: Any, then: Any) -> bool | None:
        if (first, then) not in self._cache:
            votes: Counter[bool] = Counter()
            for positions in self.position:
                a, b = positions.get(first), positions.get(then)
                if a is not None and b is not None:
                    votes[a < b] += 1
            self._cache[(first, then)] = None if votes[True] == votes[False] else votes[True] > votes[False]
        return self._cache[(first, then)]


class _StateOrder(ProgramOrder):
    """The program order of a record's ranks."""

    def __init__(self, states: list[RankState]):
        self.roles = _roles(states)
        super().__init__([self.key(group, seq) for group, seq in s.issued] for s in states)

    def key(self, group: str, seq: int) -> tuple[Any, int]:
        return (self.roles.get(group, group), seq)


def _roles(states: list[RankState]) -> dict[str, Any]:
    """group name -> the part it plays: a mesh dim (DeviceMesh names its groups "mesh_<dim>"; a call made through
    get_group carries its dim), else the part its sibling groups play (_sibling_roles), else the group itself."""
    roles: dict[str, Any] = {}
    for s in states:
        for group, desc in s.created_as.items():
            if desc.startswith("mesh_"):
                roles.setdefault(group, ("dim", desc[len("mesh_"):]))
        for call in (s.call, s.failed_in, *s.in_flight.values()):
            if call is not None and call.context is not None and len(call.context) > 1 and call.context[1] is not None:
                roles.setdefault(call.group, ("dim", str(call.context[1])))
    roles.update(_sibling_roles(states, roles))
    return roles


def _sibling_roles(states: list[RankState], roles: dict[str, Any]) -> dict[str, Any]:
    """The parts of the groups with no mesh dim, from the lines that call on them (sibling_parts)."""
    members: dict[str, frozenset[int]] = {}
    at: dict[Any, set[str]] = {}
    for s in states:
        for group, ranks in s.created.items():
            members.setdefault(group, frozenset(ranks))
        for (group, _), (site, kind) in s.call_log.items():
            if group not in roles and site is not None and kind not in POINT_TO_POINT:
                at.setdefault((site, kind), set()).add(group)
                members[group] = members.get(group, frozenset()) | {s.rank}
    return sibling_parts(at, members)


def sibling_parts(at: dict[Any, set[str]], members: dict[str, frozenset[int]]) -> dict[str, tuple[str, str]]:
    """Groups that the same line of code calls on (a step of a plan, file:line of a script: the keys of `at`),
    and that share no rank, play one part: each rank makes that call on its own group, as with the groups of
    new_subgroups, or hand-made groups of 0-3 and 4-7 that one loop all_reduces on. Where such groups overlap (a
    helper that one rank calls with two of its groups) the line says nothing, and every group keeps its own."""
    parts: dict[str, tuple[str, str]] = {}
    for groups in sorted(at.values(), key=lambda g: sorted(g)):
        if len(groups) < 2 or any(g in parts for g in groups):
            continue
        ranks = [members.get(g, frozenset()) for g in groups]
        if sum(len(r) for r in ranks) == len(frozenset().union(*ranks)):  # pairwise disjoint
            part = ("siblings", min(groups))
            parts.update({g: part for g in groups})
    return parts


def _collectives(states: list[RankState], held: dict[int, CallBegun], divergent: set[int]) -> Blame:
    """For every member that a held rank waits for: why it is not in that call. It left or stalled (a culprit),
    it went past the call to one the others make after it (it skipped it: a culprit), or it is held up upstream
    (the wait goes on through it). Members that made another call at the same position disagree: the minority
    is to blame, unless a member skipped an earlier call of the group (then its partners completed mismatched
    calls: victims). With no cause at all, the waits form a cycle of calls made in different orders."""
    order = _StateOrder(states)
    causes: dict[int, Cause] = {}
    upstream: dict[int, set[int]] = {}
    why: dict[tuple[str, int, int], Cause | None] = {}
    for rank, call in sorted(held.items()):
        for m in _not_there(states, call):
            if (call.group, call.seq, m) not in why:
                why[(call.group, call.seq, m)] = _why_missing(states, order, call, m)
            cause = why[(call.group, call.seq, m)]
            if cause is not None:
                # a skip is the root of what the rank did next (stall, leave): it wins whichever wait showed it
                if m not in causes or (cause.kind == KINDS["skipped"] != causes[m].kind):
                    causes[m] = cause
            else:
                upstream.setdefault(rank, set()).add(m)
    # each call once, however many ranks wait in it (sorted by what identifies it: sites are ints or strings)
    distinct = {(c.group, c.seq, c.kind, c.ranks): c for c in held.values()}
    for call in (distinct[k] for k in sorted(distinct)):
        skipped_before = any(c.kind == KINDS["skipped"] and c.group == call.group and c.seq is not None
                             and c.seq <= call.seq for c in causes.values())
        if not skipped_before:
            for cause in _disagreement(states, call, divergent):
                # A skip the group's own sequence shows is the root of what else the rank did (it left, waits)
                if cause.kind == KINDS["skipped"] or cause.rank not in causes:
                    causes[cause.rank] = cause
    if not causes and upstream:
        causes.update(_cycle(order, held, upstream, divergent))
    causes.update(_added_at_the_end(states, held, causes))
    if causes:
        causes.update(_skipped_behind(states, order, causes))
    if not causes:
        raised = sorted(r for r in held if states[r].end == RAISED)
        if raised:  # every member is in the call and it raised: the call itself failed on each of them
            return Blame(KINDS["raised"], raised)
        return Blame(KINDS["unknown"], [])
    ordered = sorted(causes.values(), key=lambda c: (_PRIORITY.index(c.kind), c.rank))
    culprits = sorted(causes)
    victims = _victims(states, held, culprits)
    return Blame(ordered[0].kind, culprits, ordered[0].text, victims, ordered)


def _added_at_the_end(states: list[RankState], held: dict[int, CallBegun],
                      causes: dict[int, Cause]) -> dict[int, Cause]:
    """Ranks held in a call that more of its members finished the script without, never having made a call at
    that line, added it (an all_gather_object under `if rank == last`): they are to blame, not the many that
    finished, which the rule alone would call early leavers."""
    found: dict[int, Cause] = {}
    for call in {(c.group, c.seq): c for c in held.values()}.values():
        inside = {r for r, c in held.items() if c.group == call.group and c.seq == call.seq}
        gone = [m for m in call.ranks if m < len(states) and m not in inside]
        if not gone or call.site is None or any(states[m].end != FINISHED or causes.get(m) is None
                                                or causes[m].kind != KINDS["left"] for m in gone):
            continue
        made_there = any(site == call.site for m in gone for site, _ in states[m].call_log.values())
        if len(gone) > len(inside) and not made_there:
            for m in gone:
                del causes[m]
            text = (f"added a call the others do not make: {call.kind} #{call.seq} on group "
                    f"{group_text(call.ranks)} at {_site(call.site)}, where ranks {ranks_text(gone)} finished "
                    "without one")
            found.update({r: Cause(r, KINDS["mismatched"], f"rank {r} {text}", call.group, call.seq) for r in inside})
    return found


def _skipped_behind(states: list[RankState], order: _StateOrder, causes: dict[int, Cause]) -> dict[int, Cause]:
    """A second hang behind the first: a rank that finished without a call that most finished ranks of its
    groups' part made (the dp all_reduce), while a partner in its own group of that part has not got there yet
    (held up by the first hang). Fix the first and the partner waits for it there."""
    finished = {s.rank for s in states if s.end == FINISHED}
    if not finished - set(causes):
        return {}
    members = _all_members(states)
    group_of: dict[tuple[int, Any], str] = {}  # (rank, part) -> its group of that part
    finished_in: dict[Any, int] = {}  # part -> how many finished ranks are members of one of its groups
    for group in sorted(members):
        role = order.roles.get(group, group)
        for m in members[group]:
            if (m, role) not in group_of:
                group_of[(m, role)] = group
                finished_in[role] = finished_in.get(role, 0) + (m in finished)
    made: dict[Any, set[int]] = {}
    for r in finished:
        for group, seq in states[r].issued:
            made.setdefault(order.key(group, seq), set()).add(r)
    found: dict[int, Cause] = {}
    for r in sorted(finished - set(causes)):
        mine = {order.key(g, q) for g, q in states[r].issued}
        for key, makers in made.items():
            mine_there = group_of.get((r, key[0]))
            if key in mine or mine_there is None or len(makers) * 2 <= finished_in[key[0]]:
                continue
            group = mine_there
            partners = sorted(m for m in members[group] if m != r and m not in finished)
            if partners:
                maker = states[min(makers)]
                text = (f"rank {r} finished without {_describe(states, maker, *_issued_as(maker, order, key))}"
                        f" (ranks {ranks_text(sorted(makers))} made it), so rank{'s' if len(partners) > 1 else ''} "
                        f"{ranks_text(partners)} will wait for it on group {group_text(sorted(members[group]))}: a "
                        "second hang behind the first")
                found[r] = Cause(r, KINDS["skipped"], text, group, key[1])
                break
    return found


def _all_members(states: list[RankState]) -> dict[str, set[int]]:
    """Every group's members, in one pass (_members asks for one group)."""
    members: dict[str, set[int]] = {}
    for s in states:
        for group, ranks in s.created.items():
            members.setdefault(group, set()).update(ranks)
        for call in (s.waiting_on, s.failed_in):
            if call is not None and call.kind != "new_group":
                members.setdefault(call.group, set()).update(call.ranks)
        for group in s.calls_on:  # (a group known only from calls: at least the ranks that made them)
            members.setdefault(group, set()).add(s.rank)
    return members


def _issued_as(state: RankState, order: _StateOrder, key: Any) -> tuple[str, int]:
    return next((g, q) for g, q in state.issued if order.key(g, q) == key)


_PRIORITY = (KINDS["left"], KINDS["straggler"], KINDS["skipped"], KINDS["mismatched"], KINDS["reordered"])


def _not_there(states: list[RankState], call: CallBegun) -> list[int]:
    """Members of the call's group that have not issued that call (position on the group)."""
    return [m for m in call.ranks if m < len(states) and states[m].calls_on.get(call.group, 0) <= call.seq]


def _why_missing(states: list[RankState], order: _StateOrder, call: CallBegun, m: int) -> Cause | None:
    """Why member m has not issued `call`; None when it is held up upstream (the wait goes on through it)."""
    state = states[m]
    count = state.calls_on.get(call.group, 0)
    wanted = order.key(call.group, count)
    missed = f"{call.kind} #{count} on group {group_text(call.ranks)}"
    held = blocked_call(state)
    if held is None:
        later = [(g, q) for g, q in state.issued if order.precedes(wanted, order.key(g, q))]
        if later:
            text = (f"rank {m} skipped {missed}: it made {_describe(states, state, *later[0])}, which the others "
                    "make after it")
            return Cause(m, KINDS["skipped"], text, call.group, count)
        if state.end == STUCK:
            text = (f"rank {m} is in no collective, {count} calls into group {group_text(call.ranks)} where its peers "
                    f"wait in #{call.seq}")
            return Cause(m, KINDS["straggler"], text, call.group, count)
        text = f"rank {m} {state.where} after {count} calls on group {group_text(call.ranks)}, where its peers wait"
        return Cause(m, KINDS["left"], text, call.group, count)
    if order.precedes(wanted, order.key(held.group, held.seq)):
        text = (f"rank {m} skipped {missed}: it went on to {held.kind} #{held.seq} on group {group_text(held.ranks)}, "
                "which the others make after it, and waits there")
        return Cause(m, KINDS["skipped"], text, call.group, count)
    return None


def _describe(states: list[RankState], state: RankState, group: str, seq: int) -> str:
    site, kind = state.call_log.get((group, seq), (None, "?"))
    at = f" at {_site(site)}" if site is not None else ""
    return f"{kind} #{seq} on group {group_text(_members(states, group)) if _members(states, group) else group}{at}"


def _disagreement(states: list[RankState], call: CallBegun, divergent: set[int]) -> list[Cause]:
    """Members whose calls on the group part from the others' by the time of `call`.

    Along the group's positions, the first where members made different calls tells: a minority whose call there
    is the one the others make next skipped a call; a minority that made a call the others do not (their call
    there is its next one) added one; a minority that made another kind of call (or passed other sizes) at the
    held position disagrees. Calls that differ only in where they were made are an SPMD program's own branches.
    """
    members = [m for m in call.ranks if m < len(states)]
    for seq in range(call.seq + 1):
        made = {m: states[m].call_log.get((call.group, seq)) for m in members}
        made = {m: entry for m, entry in made.items() if entry is not None}
        camps: dict[Any, list[int]] = {}
        for m, entry in sorted(made.items()):
            camps.setdefault(entry, []).append(m)
        sizes = {states[m].sizes.get((call.group, seq)) for m in made}
        if len(camps) < 2 and (len(sizes) < 2 or None in sizes):
            continue
        if all(kind in POINT_TO_POINT for _, kind in camps) and (len(sizes) < 2 or None in sizes):
            continue  # a channel's send and recv: made on each side's own line
        found = _parted(states, call, seq, camps, divergent)
        if found:
            return found
    return []


def _ahead(states: list[RankState], group: str, seq: int, entry: Any, camps: dict[Any, list[int]]) -> bool:
    """Whether the call `entry` made at position `seq` is what the members of every other camp make at seq + 1."""
    others = [m for other, ranks in camps.items() if other != entry for m in ranks]
    return bool(others) and all(states[m].call_log.get((group, seq + 1)) == entry for m in others)


def _parted(states: list[RankState], call: CallBegun, seq: int, camps: dict[Any, list[int]],
            divergent: set[int]) -> list[Cause]:
    """At one position of the group, members made different calls: who parted from whom, if anyone."""
    group = f"group {group_text(call.ranks)}"
    skipped = [entry for entry in camps if _ahead(states, call.group, seq, entry, camps)]
    if len(skipped) == 2 == len(camps):  # calls that alternate (A B A B) look one ahead either way: the fewer
        fewer, more = sorted(camps, key=lambda entry: len(camps[entry]))  # ranks parted from the many
        skipped = [fewer] if len(camps[fewer]) < len(camps[more]) else skipped
    if len(skipped) == 1:  # its call there is the one every other camp makes next
        norm = next(e for e in camps if e != skipped[0])
        return [Cause(r, KINDS["skipped"], f"rank {r} skipped {norm[1]} #{seq} on {group} (made at "
                      f"{_site(norm[0])}): its call there is the one the others make next", call.group, seq)
                for r in camps[skipped[0]]]
    added = [entry for entry in camps if len(camps) > 1 and all(
        _ahead(states, call.group, seq, other, {entry: camps[entry]}) for other in camps if other != entry)]
    if len(added) == 1:  # every other camp's call there is its next one
        return [Cause(r, KINDS["mismatched"], f"rank {r} added a call the others do not make: {added[0][1]} "
                      f"#{seq} on {group} at {_site(added[0][0])}", call.group, seq) for r in camps[added[0]]]
    kinds = {entry[1] for entry in camps}
    sized = {states[m].sizes.get((call.group, seq)) for ranks in camps.values() for m in ranks}
    if len(kinds) < 2 and (len(sized) < 2 or None in sized):
        return []  # the same call from different lines: the program's own branches
    by_call: dict[str, list[int]] = {}
    for entry, ranks in camps.items():
        for m in ranks:
            sizes = states[m].sizes.get((call.group, seq)) if None not in sized else None
            by_call.setdefault(f"{entry[1]} of {sizes}" if sizes else entry[1], []).append(m)
    largest = max(len(v) for v in by_call.values())
    top = [made for made, ranks in by_call.items() if len(ranks) == largest]
    odd = sorted(m for made, ranks in by_call.items() if len(top) > 1 or made != top[0] for m in ranks)
    if len(top) > 1 and divergent & set(odd):
        odd = sorted(divergent & set(odd))
    mine = {m: made for made, ranks in by_call.items() for m in ranks}
    others = f" where the others made {top[0]}" if len(top) == 1 else " and no two members agree"
    return [Cause(r, KINDS["mismatched"], f"rank {r} made {mine[r]} #{seq} on {group}{others}", call.group, seq)
            for r in odd]


def _cycle(order: _StateOrder, held: dict[int, CallBegun], upstream: dict[int, set[int]],
           divergent: set[int]) -> dict[int, Cause]:
    """Every wait leads to another rank's wait: calls made in different orders. The ranks whose held call breaks
    the majority's program order are to blame. Where no rank made both calls (two ranks took a step's two calls
    in the other order: each side holds only its own), the call more ranks wait in is the program's next one,
    and the fewer ranks that wait in the other parted from it; with no majority either, the plan's divergent
    ranks, else every rank of the cycle."""
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
            text = (f"rank {m} waits in {theirs.kind} #{theirs.seq} on group {group_text(theirs.ranks)} while rank "
                    f"{rank} waits for it in {call.kind} #{call.seq} on group {group_text(call.ranks)}: the two make "
                    "these calls in opposite orders")
            blamed.setdefault(m, Cause(m, KINDS["reordered"], text, call.group, call.seq))
    if divergent & set(blamed):
        blamed = {r: c for r, c in blamed.items() if r in divergent}
    return blamed


def _victims(states: list[RankState], held: dict[int, CallBegun], culprits: list[int]) -> dict[int, str]:
    """What every rank that is not to blame did: where it waits, and a call it completed paired with another
    call of a culprit (a mismatched collective, because its partner skipped or added one)."""
    out: dict[int, str] = {}
    for rank, call in held.items():
        if rank in culprits:
            continue
        verb = "raised in" if states[rank].end == RAISED else "waits in"
        out[rank] = f"{verb} {call.kind} #{call.seq} on group {group_text(call.ranks)}"
    pairings: dict[int, list[str]] = {}
    for culprit in culprits:
        for (group, seq), (site, kind) in sorted(states[culprit].call_log.items()):
            for m in _members(states, group):
                theirs = states[m].call_log.get((group, seq))
                if m in culprits or theirs is None or theirs == (site, kind) or _in(states[m], group, seq):
                    continue
                pairings.setdefault(m, []).append(
                    f"{theirs[1]} #{seq} at {_site(theirs[0])} paired with rank {culprit}'s {kind} at {_site(site)}")
    for m, pairs in pairings.items():
        more = f" (and {len(pairs) - 1} more)" if len(pairs) > 1 else ""
        now = out.get(m) or ("finished" if states[m].end == FINISHED and states[m].done else states[m].where)
        out[m] = (now + f"; earlier it completed {pairs[0]}{more}: a mismatched collective, "
                  "because its partner skipped or added a call")
    return out


def _in(state: RankState, group: str, seq: int) -> bool:
    """Whether the rank is held in that very call (it has not completed it)."""
    call = blocked_call(state)
    return call is not None and call.group == group and call.seq == seq


def _members(states: list[RankState], group: str) -> list[int]:
    for s in states:
        if s.waiting_on is not None and s.waiting_on.group == group:
            return list(s.waiting_on.ranks)
        if group in s.created:
            return list(s.created[group])
    return [s.rank for s in states if group in s.calls_on]


def _site(site: Any) -> str:
    return f"step {site}" if isinstance(site, int) else str(site)


# ------------------------------------------------------------------------------------------ group creation


def _creation(states: list[RankState], held: dict[int, CallBegun]) -> Blame:
    diverged = _mesh_divergence(states)
    if diverged is not None:
        return diverged
    drifted = _drift(states)
    if drifted is not None:
        return drifted
    creating = [(rank, call) for rank, call in held.items() if call.kind == "new_group"]
    # Ranks disagree about which group a name stands for (rank maps that differ across ranks).
    for _, call in creating:
        camps: dict[tuple[int, ...], list[int]] = {}
        for s in states:
            ranks = s.created.get(call.group)
            if ranks is not None:
                camps.setdefault(ranks, []).append(s.rank)
        if len(camps) > 1:
            return Blame(KINDS["inconsistent"], _smaller_camps(list(camps.values())))
    # The same group under another name: some ranks created groups that others skipped, so the group counters
    # drifted. Those that skipped (fewer creations) are at fault.
    counts = {s.rank: s.groups_created for s in states}
    involved = {m for _, call in creating for m in call.ranks}
    top = max(counts[r] for r in involved)
    behind = sorted(r for r in involved if counts[r] < top)
    return Blame(KINDS["subset"], behind or sorted({m for _, call in creating for m in missing_from(call, states)}))


def _drift(states: list[RankState]) -> Blame | None:
    """The same group (its ranks) created under different names: torch names a group by a counter that every
    new_group call moves, members or not, so the ranks whose name for it is the earlier one skipped a new_group
    before it (the classic `if rank in members: new_group(members)`): they are to blame."""
    names: dict[tuple[int, ...], dict[int, list[int]]] = {}  # a group's ranks -> rank -> its names for it
    for s in states:
        for name, ranks in s.created.items():
            if name.isdigit():
                names.setdefault(ranks, {}).setdefault(s.rank, []).append(int(name))
    for ranks, by_rank in sorted(names.items()):
        camps: dict[tuple[int, ...], list[int]] = {}
        for rank, numbers in sorted(by_rank.items()):
            camps.setdefault(tuple(sorted(numbers)), []).append(rank)
        if len(camps) < 2 or len({len(key) for key in camps}) > 1:
            continue  # one name for it everywhere, or created more often on some ranks (not a drift)
        ordered = sorted(camps)
        behind, later = camps[ordered[0]], sorted(r for key in ordered[1:] for r in camps[key])
        many, others = ("s" if len(behind) > 1 else ""), ("s" if len(later) > 1 else "")
        note = (f"Group {group_text(ranks)} is group {ordered[0][0]} on rank{many} {ranks_text(behind)} but group "
                f"{ordered[-1][0]} on rank{others} {ranks_text(later)}: rank{many} {ranks_text(behind)} skipped a "
                "new_group before it (every rank must call new_group, members or not).")
        return Blame(KINDS["subset"], behind, note)
    return None


def _mesh_divergence(states: list[RankState]) -> Blame | None:
    """Compare the meshes each rank built (shape and ranks), in order; the first disagreement explains.

    A rank waiting to create the groups of an earlier mesh has not got there yet and is left out.
    """
    depth = max((len(s.meshes) for s in states), default=0)
    for k in range(depth):
        camps: dict[Any, list[int]] = {}
        for s in states:
            if len(s.meshes) > k:
                camps.setdefault(_mesh_key(s.meshes[k]), []).append(s.rank)
            elif not (s.call is not None and s.call.kind == "new_group"):
                camps.setdefault(None, []).append(s.rank)  # moved on without building it
        if len(camps) < 2:
            continue
        built = {key: ranks for key, ranks in camps.items() if key is not None}
        note = _describe_camps(camps)
        if None in camps and len(built) == 1:
            return Blame(KINDS["subset"], sorted(camps[None]), note)
        for key, ranks in built.items():
            ahead = [s for s in states if s.rank not in ranks and len(s.meshes) > k + 1]
            if any(_mesh_key(s.meshes[k + 1]) == key for s in ahead):
                return Blame(KINDS["subset"], sorted(ranks + camps.get(None, [])), note)  # they skipped a mesh
        return Blame(KINDS["inconsistent"], _smaller_camps(list(camps.values())), note)
    return None


def _describe_camps(camps: dict[Any, list[int]]) -> str:
    parts = []
    for key, ranks in sorted(camps.items(), key=lambda kv: -len(kv[1])):
        who = f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}"
        if key is None:
            parts.append(f"{who} built no mesh there")
        else:
            shape, members = key
            parts.append(f"{who} built a {tuple(shape)} mesh over {ranks_text(sorted(set(members)))}")
        if len(parts) == 3:
            break
    return "The meshes disagree: " + "; ".join(parts) + "."


def _mesh_key(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    _, shape, _, ranks = entry
    return (tuple(shape), tuple(ranks))


def _smaller_camps(camps: list[list[int]]) -> list[int]:
    """Every camp but the largest (all of them when no camp is larger than the rest)."""
    largest = max(len(c) for c in camps)
    if sum(1 for c in camps if len(c) == largest) > 1:
        return sorted(r for c in camps for r in c)
    return sorted(r for c in camps if len(c) < largest for r in c)
