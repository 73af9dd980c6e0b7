"""Hangs among collectives: why each member that a held rank waits for is not in its call, and who parted from
whom where members made different calls."""

from __future__ import annotations

from typing import Any

from ...core.outcome import KINDS
from ...core.ranks import group_text, ranks_text
from ...core.record import RankState
from ...core.wire import FINISHED, POINT_TO_POINT, RAISED, RECVS, ROOTED, SENDS, STUCK, CallBegun, channel_group
from .calls import Blame, Cause, blocked_call, held_in, members_of, missing_from, own_line, site_text
from .cycles import cycle_causes
from .images import image_causes
from .parts import Reference, StateOrder
from .siblings import added_alone, added_not_skipped, added_off_the_path, by_siblings, ended_without, on_another_group
from .tags import off_group_channels, tag_causes


def collectives_blame(states: list[RankState], held: dict[int, CallBegun], divergent: set[int],
                      unseen: str = "", hidden: dict[int, str] | None = None) -> Blame:
    """For every member that a held rank waits for: why it is not in that call. It left or stalled (a culprit),
    it went past the call to one the others make after it (it skipped it: a culprit), or it is held up upstream
    (the wait goes on through it). Members that made another call at the same position disagree: the siblings
    (meshsim.judge.blame.siblings), else the group's majority, say who departs, unless a member skipped an
    earlier call of the group (then its partners completed mismatched calls: victims). With no cause at all: a
    send and a recv that wait for each other under different tags (meshsim.judge.blame.tags); counts before order:
    ranks held in a call past the count their part's ranks made added it; then the waits form a cycle
    (meshsim.judge.blame.cycles). `unseen`: calls the record cannot show (a rank in none of its
    calls may wait in one of those: a candidate, not a straggler); `hidden`: ranks in no call the record shows whose
    stack is in torch's distributed code (where it is): each may wait in a call torch makes from C++."""
    order = StateOrder(states)
    ref = Reference(states, order.roles)
    causes, upstream = _missing(states, order, held, unseen, hidden or {})
    added_not_skipped(states, ref, held, causes)
    # each call once, however many ranks wait in it (sorted by what identifies it: sites are ints or strings)
    distinct = {(c.group, c.seq, c.kind, c.ranks): c for c in held.values()}
    for call in (distinct[k] for k in sorted(distinct)):
        skipped_before = any(c.kind == KINDS["skipped"] and c.group == call.group and c.seq is not None
                             and c.seq <= call.seq for c in causes.values())
        if not skipped_before:
            for cause in _disagreement(states, ref, call, divergent):
                # A skip the group's own sequence shows is the root of what else the rank did (it left, waits)
                if cause.kind == KINDS["skipped"] or cause.rank not in causes:
                    causes[cause.rank] = cause
    causes = _counts_refute(states, ref, held, causes)
    if not causes and upstream:  # a send and a recv between the same ranks under different tags wait for each other
        causes.update(tag_causes(states, held))
    if not causes and upstream:  # or on different process groups: a helper's call without the pipeline's group
        causes.update(off_group_channels(states, held))
    if not causes and upstream:  # counts before order: one call more than the siblings made, at a line of its own
        causes.update(added_alone(states, ref, held))
    in_cycle: dict[int, Cause] = {}
    if not causes and upstream:  # (candidates explain waits too: no cycle where a rank may be elsewhere)
        in_cycle = cycle_causes(states, order, held, upstream, divergent)
        causes.update(in_cycle)
        added = added_off_the_path(states, held)  # a cycle behind a call no other rank makes: that call
    else:
        added = {}
    if _decided(causes):  # a second culprit beside the first: one call more than its part made
        causes.update(_beside(added_alone(states, ref, held), causes, held))
    causes.update(_added_at_the_end(states, ref, held, causes))
    # (a culprit the cycle's pattern named is a pipeline's: its stages make different calls, and program order,
    # which a second hang is read from, holds within a stage only)
    if _decided(causes) and not (in_cycle and all(causes[r] is in_cycle.get(r) for r in causes)):
        causes.update(_skipped_behind(states, order, causes))
        causes.update(_counts_refute(states, ref, held, _skipped_ahead(states, order, held, causes)))
    on_another_group(states, ref, held, causes)
    departing = image_causes(states)  # the whole program, through the cluster's symmetries, over one group's view
    decided = {r for r, c in causes.items() if not c.candidate}
    if departing and set(departing) != decided and not (set(departing) < decided and
                                                        _counted_extra(states, ref, held, decided - set(departing))):
        causes = departing  # (the symmetries name the first culprit; a second one's extra call its counts tell)
    elif departing and set(departing) == decided and all(causes[r] is in_cycle.get(r) for r in decided):
        causes = departing  # (a cycle's pattern agrees: the whole program's view says more than one pair's)
    elif not departing and added and (set(added) < decided or not decided
                                      or set(added) == decided and _went_round_without(states, held, added)):
        # (where only candidates were left, the call off the path decides; of the cycle's others, a rank that
        # does not wait for the call's makers departs on its own: a second culprit, as a skip on another host;
        # where the cycle names the same ranks, their count says more than the order of two calls)
        causes = {**{r: c for r, c in causes.items() if r in decided and r in held and r not in added
                     and not set(held[r].ranks) & set(added) and _skipped_here(states, held, r)}, **added}
    else:
        causes = _behind_a_culprit(causes, in_cycle, held)
    return _blamed(states, held, _within_a_joined_call(states, held, _knocked_off(states, causes)), unseen)


def _within_a_joined_call(states: list[RankState], held: dict[int, CallBegun], causes: dict[int, Cause]
                          ) -> dict[int, Cause]:
    """Where every member of a rooted call is in it, with no root the record shows (a Flight Recorder dump's
    broadcast), and it never completed, the members disagree on its root (two receivers, or two roots): every other
    wait ends there, so the culprit is one of them. Culprits named elsewhere give way to its members as candidates,
    each with its line, since nothing recorded tells which of them named the wrong root."""
    rooted = {(c.group, c.seq): c for c in held.values() if c.kind in ROOTED and c.root is None and len(c.ranks) > 1}
    # (each call once: every rank held in a world broadcast asks the same question of all its members)
    joined = {key: c for key, c in rooted.items() if not missing_from(c, states)}
    members = {m for c in joined.values() for m in c.ranks}
    decided = {r for r, c in causes.items() if not c.candidate}
    if not joined or (decided and decided <= members):
        return causes
    found = {}
    for call in joined.values():
        for m in call.ranks:
            others = [o for o in call.ranks if o != m]
            found[m] = Cause(m, KINDS["unknown"], (
                f"rank {m} is in {call.kind} #{call.seq} on group {group_text(call.ranks)} at "
                f"{site_text(held[m].site)}, with rank{'s' if len(others) > 1 else ''} {ranks_text(others)}: every "
                "member joined it and it never completed, so they disagree on its root (two receivers, or two "
                "roots), which the record does not show"), call.group, call.seq, candidate=True)
    return found


def _skipped_here(states: list[RankState], held: dict[int, CallBegun], r: int) -> bool:
    """Whether ranks wait for rank r in a call at a line it passed before (it went on from there, as the others
    do not)."""
    passed = {site for site, _ in states[r].call_log.values()}
    return any(r in call.ranks and r != w and call.site in passed and states[r].calls_on.get(call.group, 0) <= call.seq
               for w, call in held.items())


def _went_round_without(states: list[RankState], held: dict[int, CallBegun], added: dict[int, Cause]) -> bool:
    """Whether each rank said to have added a call had made a call before at the line where the members it waits
    for are held, and they never called on the group of its call: the program went through that line without the
    call, so the call is one more (an EMA sync when its own sample clock crosses), not their next call taken early
    (two groups' calls taken in the other order, on groups each rank calls every step)."""
    for r in added:
        passed = {site for site, _ in states[r].call_log.values()}
        waited = [m for m in held[r].ranks if m in held and m != r]
        if not waited or any(held[m].site not in passed or states[m].calls_on.get(held[r].group, 0) for m in waited):
            return False
    return True


def _counted_extra(states: list[RankState], ref: Reference, held: dict[int, CallBegun], ranks: set[int]) -> bool:
    """Whether each of these ranks is held on a group whose part it made more calls on than most ranks did, and
    made a call at a line no other rank reached: it added a call there, which its counts show (not ranks one call
    ahead of a culprit that never joined them)."""
    for r in ranks:
        if r not in held or not own_line(states, r):
            return False
        if not ref.made_more(r, ref.part(held[r].group)):
            return False
    return True


def _counts_refute(states: list[RankState], ref: Reference, held: dict[int, CallBegun], causes: dict[int, Cause]
                   ) -> dict[int, Cause]:
    """Counts before order: a rank said to have skipped a call on a group, which made as many calls on its part as
    most ranks did, while a rank held on that group made one more, at a line of its own, did not skip it: that rank
    added one (a queue reset's extra all_reduce that its node partners completed with their own, who went on)."""
    kept = {}
    for r, cause in causes.items():
        if cause.kind == KINDS["skipped"] and cause.group is not None and not cause.candidate:
            part = ref.part(cause.group)
            more = [w for w, call in held.items()
                    if call.group == cause.group and ref.made_more(w, part) and own_line(states, w)]
            if more and ref.count(r, part) == ref.usual(part):
                continue
        kept[r] = cause
    return kept


def _knocked_off(states: list[RankState], causes: dict[int, Cause]) -> dict[int, Cause]:
    """Without the ranks that completed, with another call of theirs, the very call a culprit added or mismatched
    (its tp partner's next all_reduce pairs with a monitor all_reduce on the wrong dim): from there on the partner
    is a call ahead of its peers on that group, and what it departs in later follows from that."""
    knocked = set()
    for r, cause in causes.items():
        if cause.candidate or cause.kind != KINDS["mismatched"] or cause.group is None or cause.seq is None:
            continue
        made = states[r].call_log.get((cause.group, cause.seq))
        for m in members_of(states, cause.group):
            theirs = states[m].call_log.get((cause.group, cause.seq)) if m != r and m < len(states) else None
            partner_cause = causes.get(m)
            if made is not None and theirs is not None and theirs[0] != made[0] and partner_cause is not None \
                    and (partner_cause.group, partner_cause.seq) != (cause.group, cause.seq):
                knocked.add(m)
    kept = {r: c for r, c in causes.items() if r not in knocked}
    return kept if any(not c.candidate for c in kept.values()) else causes


def _behind_a_culprit(causes: dict[int, Cause], in_cycle: dict[int, Cause],
                      held: dict[int, CallBegun]) -> dict[int, Cause]:
    """Of the ranks a cycle named for calls taken in opposite orders, those held in a call that waits for another
    rank it named decidedly are behind that one, not out of order (a tp partner held in the pair call its writer
    skipped for a barrier)."""
    decided = {r for r, c in causes.items() if not c.candidate}
    behind = {r for r, c in causes.items() if c is in_cycle.get(r) and c.kind == KINDS["reordered"] and r in held
              and (decided - {r}) & set(held[r].ranks) and not (decided - {r}) & _waiting_for(held, r)}
    return {r: c for r, c in causes.items() if r not in behind} if behind and decided - behind else causes


def _waiting_for(held: dict[int, CallBegun], r: int) -> set[int]:
    """The ranks held in a call that rank r is a member of (they wait for it, or with it)."""
    return {w for w, call in held.items() if w != r and r in call.ranks}


def _beside(found: dict[int, Cause], causes: dict[int, Cause], held: dict[int, CallBegun]) -> dict[int, Cause]:
    """Of the culprits another rule found, those that are not already named and do not wait for a named one (a
    rank held behind a culprit waits as it should)."""
    return {r: c for r, c in found.items() if r not in causes and not set(held[r].ranks) & set(causes)}


def _decided(causes: dict[int, Cause]) -> bool:
    return any(not c.candidate for c in causes.values())


def _blamed(states: list[RankState], held: dict[int, CallBegun], causes: dict[int, Cause], unseen: str) -> Blame:
    """The culprits, the most telling cause first; where the evidence cannot decide, no culprit and the
    candidates, each with its reason (never a set that mixes culprits and ranks that wait as they should)."""
    candidates = sorted((c for c in causes.values() if c.candidate), key=lambda c: c.rank)
    decided = {r: c for r, c in causes.items() if not c.candidate}
    if not decided:
        raised = sorted(r for r in held if states[r].end == RAISED)
        if raised and not candidates:  # every member is in the call and it raised: the call failed on each
            return Blame(KINDS["raised"], raised)
        note = ""
        if candidates:
            who = ranks_text([c.rank for c in candidates])
            note = (f"The evidence cannot decide between ranks {who}, each named with what it did and none blamed"
                    + (f" ({unseen})" if unseen else "") + f". The Python stacks of ranks {who} (py-spy dump) "
                    "show where each is held and for which peer: that points at the cause.")
        return Blame(KINDS["unknown"], [], note, victims_of(states, held, []), [], candidates)
    ordered = sorted(decided.values(), key=lambda c: (_PRIORITY.index(c.kind), c.rank))
    culprits = sorted(decided)
    victims = victims_of(states, held, culprits)
    return Blame(ordered[0].kind, culprits, ordered[0].text, victims, ordered, candidates)


def _missing(states: list[RankState], order: StateOrder, held: dict[int, CallBegun], unseen: str,
             hidden: dict[int, str]) -> tuple[dict[int, Cause], dict[int, set[int]]]:
    """Why each member a held rank waits for is not in its call; the members held up upstream, by waiting rank."""
    causes: dict[int, Cause] = {}
    upstream: dict[int, set[int]] = {}
    why: dict[tuple[str, int, int], Cause | None] = {}
    for rank, call in sorted(held.items()):
        for m in _not_there(states, call):
            if (call.group, call.seq, m) not in why:
                why[(call.group, call.seq, m)] = _why_missing(states, order, call, m, unseen, hidden.get(m))
            cause = why[(call.group, call.seq, m)]
            if cause is not None:
                # a skip is the root of what the rank did next (stall, leave): it wins whichever wait showed it
                if m not in causes or (cause.kind == KINDS["skipped"] != causes[m].kind):
                    causes[m] = cause
            else:
                upstream.setdefault(rank, set()).add(m)
    return causes, upstream


def _added_at_the_end(states: list[RankState], ref: Reference, held: dict[int, CallBegun],
                      causes: dict[int, Cause]) -> dict[int, Cause]:
    """Ranks held in a call that more of the ranks playing its part finished without (its members that finished,
    and its sibling groups' ranks), never having made a call at that line, added it (an all_gather_object under
    `if rank == last`, an evaluation all_reduce under `if rank == 1`): they are to blame, not the ranks that
    finished, which the rule alone would call early leavers."""
    found: dict[int, Cause] = {}
    for call in {(c.group, c.seq): c for c in held.values()}.values():
        inside = {r for r, c in held.items() if c.group == call.group and c.seq == call.seq}
        gone = [m for m in call.ranks if m < len(states) and m not in inside]
        if not gone or call.site is None or any(states[m].end != FINISHED or causes.get(m) is None
                                                or causes[m].kind != KINDS["left"] for m in gone):
            continue
        made_there = any(site == call.site for m in gone for site, _ in states[m].call_log.values())
        if ended_without(states, ref, call, inside, gone) and not made_there:
            for m in gone:
                del causes[m]
            text = (f"added a call the others do not make: {call.kind} #{call.seq} on group "
                    f"{group_text(call.ranks)} at {site_text(call.site)}, where ranks {ranks_text(gone)} finished "
                    "without one")
            found.update({r: Cause(r, KINDS["mismatched"], f"rank {r} {text}", call.group, call.seq) for r in inside})
    return found


def _skipped_behind(states: list[RankState], order: StateOrder, causes: dict[int, Cause]) -> dict[int, Cause]:
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


def _skipped_ahead(states: list[RankState], order: StateOrder, held: dict[int, CallBegun],
                  causes: dict[int, Cause]) -> dict[int, Cause]:
    """A second hang behind the first, on a rank that waits: it is held in a call that the program makes after a
    call on one of its groups that it never made (its count there is short), while a partner in that group has not
    got there yet (held up by the first hang). A rank makes its calls in program order, so it skipped that one."""
    members = _all_members(states)
    # a pair's point-to-point calls are counted on their channels, each side its own: not calls every member makes
    pairs = {name for s in states for (g, _), (_, kind) in s.call_log.items() if kind in POINT_TO_POINT or "->" in g
             for name in (g, channel_group(g))}  # (and the group whose channels they are)
    # a rank held where the first hang's culprits departed from its group waits at a position whose call the
    # members disagree on: where that stands in the program is the first hang's question, not a second hang
    disputed = {(c.group, c.seq) for c in causes.values() if not c.candidate}
    found: dict[int, Cause] = {}
    for r, call in sorted(held.items()):
        if r in causes or (call.group, call.seq) in disputed:
            continue
        here = order.key(call.group, call.seq)
        for group in sorted(g for g, ranks in members.items() if r in ranks and g != call.group and g not in pairs):
            count = states[r].calls_on.get(group, 0)
            partners = sorted(m for m in members[group] if m != r and states[m].calls_on.get(group, 0) <= count
                              and states[m].end != FINISHED)
            if not partners or order.precedes(order.key(group, count), here) is not True:
                continue
            wanted = order.key(group, count)
            made = next(((s, g) for s in states for g, q in s.issued if q == count and order.key(g, q) == wanted),
                        None)
            missed = _describe(states, made[0], made[1], count).replace(
                f"group {group_text(members_of(states, made[1]))}", f"group {group_text(sorted(members[group]))}") \
                if made is not None else f"call #{count} on group {group_text(sorted(members[group]))}"
            found[r] = Cause(r, KINDS["skipped"], (
                f"rank {r} skipped {missed}: it went on to {call.kind} #{call.seq} on group {group_text(call.ranks)}, "
                f"which the others make after it, so rank{'s' if len(partners) > 1 else ''} {ranks_text(partners)} "
                "will wait for it there: a second hang behind the first"), group, count)
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


def _issued_as(state: RankState, order: StateOrder, key: Any) -> tuple[str, int]:
    return next((g, q) for g, q in state.issued if order.key(g, q) == key)


_PRIORITY = (KINDS["left"], KINDS["straggler"], KINDS["skipped"], KINDS["mismatched"], KINDS["tag"],
             KINDS["reordered"])


def _not_there(states: list[RankState], call: CallBegun) -> list[int]:
    """Members of the call's group that have not issued that call (position on the group)."""
    return [m for m in call.ranks if m < len(states) and states[m].calls_on.get(call.group, 0) <= call.seq]


def _why_missing(states: list[RankState], order: StateOrder, call: CallBegun, m: int, unseen: str = "",
                 inside: str | None = None) -> Cause | None:
    """Why member m has not issued `call`; None when it is held up upstream (the wait goes on through it). A rank
    in no call where the record cannot show some (`unseen`) may wait in one of those: a candidate."""
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
            if unseen:
                text += "; it may wait in a call the record cannot show rather than stall"
            elif inside:
                text += (f"; its stack is in torch's distributed code ({inside}), outside any call meshsim follows: it "
                         "may wait in one torch makes from C++ (DDP's bucket rebuild, its buffer broadcasts) rather "
                         "than stall")
            return Cause(m, KINDS["straggler"], text, call.group, count, candidate=bool(unseen or inside))
        text = f"rank {m} {state.where} after {count} calls on group {group_text(call.ranks)}, where its peers wait"
        return Cause(m, KINDS["left"], text, call.group, count)
    if order.precedes(wanted, order.key(held.group, held.seq)):
        went = f"{held.kind} #{held.seq} on group {group_text(held.ranks)}"
        mine, theirs = channel_group(call.group), channel_group(held.group)
        if tuple(held.ranks) == tuple(call.ranks) and mine != theirs:  # two process groups of the same members
            missed, went = f"{missed} (process group {mine})", f"{went} (process group {theirs})"
        text = f"rank {m} skipped {missed}: it went on to {went}, which the others make after it, and waits there"
        return Cause(m, KINDS["skipped"], text, call.group, count)
    return None


def _describe(states: list[RankState], state: RankState, group: str, seq: int) -> str:
    site, kind = state.call_log.get((group, seq), (None, "?"))
    at = f" at {site_text(site)}" if site is not None else ""
    return f"{kind} #{seq} on group {group_text(members_of(states, group)) if members_of(states, group) else group}{at}"


def _disagreement(states: list[RankState], ref: Reference, call: CallBegun, divergent: set[int]) -> list[Cause]:
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
        found = by_siblings(states, ref, call, seq, camps) if len(camps) > 1 else None
        if found is None:
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
                      f"{site_text(norm[0])}): its call there is the one the others make next", call.group, seq)
                for r in camps[skipped[0]]]
    added = [entry for entry in camps if len(camps) > 1 and all(
        _ahead(states, call.group, seq, other, {entry: camps[entry]}) for other in camps if other != entry)]
    if len(added) == 1:  # every other camp's call there is its next one
        return [Cause(r, KINDS["mismatched"], f"rank {r} added a call the others do not make: {added[0][1]} "
                      f"#{seq} on {group} at {site_text(added[0][0])}", call.group, seq) for r in camps[added[0]]]
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
    undecided = len(top) > 1
    if undecided and divergent & set(odd):
        odd, undecided = sorted(divergent & set(odd)), False
    mine = {m: made for made, ranks in by_call.items() for m in ranks}
    others = f" where the others made {top[0]}" if len(top) == 1 else " and no two members agree"
    return [Cause(r, KINDS["mismatched"], f"rank {r} made {mine[r]} #{seq} on {group}{others}", call.group, seq,
                  candidate=undecided) for r in odd]


def victims_of(states: list[RankState], held: dict[int, CallBegun], culprits: list[int]) -> dict[int, str]:
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
            for m in members_of(states, group):
                theirs = states[m].call_log.get((group, seq))
                if m in culprits or theirs is None or theirs == (site, kind) or held_in(states[m], group, seq) \
                        or _send_and_recv(kind, theirs[1]):
                    continue
                pairings.setdefault(m, []).append(f"{theirs[1]} #{seq} at {site_text(theirs[0])} paired with rank "
                                                  f"{culprit}'s {kind} at {site_text(site)}")
    for m, pairs in pairings.items():
        more = f" (and {len(pairs) - 1} more)" if len(pairs) > 1 else ""
        now = out.get(m) or ("finished" if states[m].end == FINISHED and states[m].done else states[m].where)
        out[m] = (now + f"; earlier it completed {pairs[0]}{more}: a mismatched collective, "
                  "because its partner skipped or added a call")
    return out


def _send_and_recv(kind: str, other: str) -> bool:
    """A send paired with a recv: one message, as the program meant (a channel's two ends make different calls)."""
    return (kind in SENDS and other in RECVS) or (kind in RECVS and other in SENDS)
