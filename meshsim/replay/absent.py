"""Where the dumps do not show a rank, from its peers' dumps: a rank without a dump (never simply "arrived", never
simply "dead"), and a rank held before its call's entry is written (unrecorded_holds).

A missing file does not say the rank died: it may have exited, been killed, failed to write (gloo's group
construction holds the GIL, so no Python thread of that rank can dump), or its file was lost on the way. What
its peers' dumps prove is kept apart from what is inferred:

- proven: the calls a member of its group finished (a collective completes on every member or on none), so
  the rank made them;
- its place: ranks that finished exactly as many calls in every part of the program (its twins, in SPMD code)
  are where it would be. If they wait in a call, it is taken to wait in the same call on its own group; if
  every other member of that group is already waiting there, the call would have completed with it, so it
  is not there: it is gone (died, exited, or stuck where nothing records it), and to blame;
- no twins: only its proven calls are known, and meshsim's one rule decides from them (a proven call that the
  program makes after one its peers wait in shows it skipped that one; otherwise it is where they wait for it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .records import IN_FLIGHT, Call, Incident, ProgramOrder, _ranks_text


@dataclass
class Absent:
    rank: int
    proven: list[Call] = field(default_factory=list)  # its peers' records of calls it made, in program order
    twins: list[int] = field(default_factory=list)  # dumped ranks that finished as many calls in every role
    held: Call | None = None  # the call it is taken to wait in (a twin's, moved to its own group)
    gone: bool = False  # it cannot be where its place says: every other member is there already
    text: str = ""  # what is known and what is inferred, in words


def infer(incident: Incident) -> dict[int, Absent]:
    """Every rank without a dump, placed from its peers' dumps (see the module's docstring)."""
    out = {m: _place(incident, m) for m in incident.missing}
    for absent in out.values():
        if absent.held is not None and _others_all_there(incident, absent.held, out):
            absent.gone = True
    for absent in out.values():
        absent.text = _text(incident, absent)
    return out


def _place(incident: Incident, m: int) -> Absent:
    absent = Absent(m, _proven(incident, m))
    mine = _done(incident, absent.proven)
    absent.twins = [r for r in incident.dumped if _same_progress(incident, r, mine, m)]
    places = Counter(_held_role(incident, incident.ranks[r].held) for r in absent.twins)
    if not places:
        absent.held = _awaited(incident, m, absent.proven)
        return absent
    (place, votes), *rest = places.most_common()
    if rest and rest[0][1] == votes:
        absent.twins = []  # its twins disagree: its place is not known
        absent.held = _awaited(incident, m, absent.proven)
        return absent
    if place is not None:
        twin = next(incident.ranks[r].held for r in absent.twins
                    if _held_role(incident, incident.ranks[r].held) == place)
        group = _own_group(incident, m, place[0])
        if twin is not None and group is not None:
            absent.held = Call(m, group, twin.seq, twin.op, twin.in_sizes, twin.out_sizes, twin.in_dtypes,
                               twin.out_dtypes, twin.state, "inferred", twin.site, -1, 0, twin.ops)
    return absent


def _awaited(incident: Incident, m: int, proven: list[Call]) -> Call | None:
    """With no twins: the one call that ranks wait in on a group of m's, that is m's next call on that group, and
    that could not complete even with m there (another member is missing from it), is where m would wait."""
    done = {(c.group, c.seq) for c in proven}
    found = {}
    for r in incident.dumped:
        held = incident.ranks[r].held
        if held is None or m not in incident.groups[held.group].ranks or (held.group, held.seq) in done:
            continue
        nxt = 1 + max((seq for group, seq in done if group == held.group), default=0)
        others = [incident.ranks[o] for o in incident.groups[held.group].ranks if o not in (m, r)]
        short = any(not o.dumped or _where(o.held) != (held.group, held.seq) for o in others)
        if held.seq == nxt and short:
            found[(held.group, held.seq)] = held
    if len(found) != 1:
        return None
    (held,) = found.values()
    return Call(m, held.group, held.seq, held.op, held.in_sizes, held.out_sizes, held.in_dtypes, held.out_dtypes,
                held.state, "inferred", held.site, -1, 0, held.ops, held.p2p)


def _where(call: Call | None) -> tuple[str, int] | None:
    return None if call is None else (call.group, call.seq)


def _proven(incident: Incident, m: int) -> list[Call]:
    """Calls of m's groups that a member finished (so m made them), one a (group, seq), in program order."""
    found: dict[tuple[str, int], Call] = {}
    for g in incident.groups_of(m):
        for r in g.ranks:
            rec = incident.ranks[r]
            if not rec.dumped:
                continue
            for c in rec.on(g.key):
                if c.finished and (g.key, c.seq) not in found:
                    found[(g.key, c.seq)] = c
    order = ProgramOrder(incident)
    calls = sorted(found.values(), key=lambda c: (c.time_ns, c.seq))
    return _program_sorted(calls, order)


def _program_sorted(calls: list[Call], order: Any) -> list[Call]:
    """Insertion by the majority's program order, where it has a say (time of creation otherwise)."""
    out: list[Call] = []
    for c in calls:
        at = len(out)
        while at > 0 and order.precedes(order.key(c), order.key(out[at - 1])) is True:
            at -= 1
        out.insert(at, c)
    return out


def _done(incident: Incident, calls: list[Call]) -> dict[tuple, int]:
    """role -> the highest count of finished calls in it."""
    done: dict[tuple, int] = {}
    for c in calls:
        role = incident.role(c.group)
        done[role] = max(done.get(role, 0), c.seq)
    return done


def _same_progress(incident: Incident, r: int, mine: dict[tuple, int], m: int) -> bool:
    rec = incident.ranks[r]
    roles_of_m = {incident.role(g.key) for g in incident.groups_of(m)}
    theirs = _done(incident, [c for c in rec.calls if c.finished])
    shared = [role for role in roles_of_m if any(incident.role(g.key) == role for g in incident.groups_of(r))]
    return bool(shared) and all(theirs.get(role, 0) == mine.get(role, 0) for role in shared)


def _held_role(incident: Incident, call: Call | None) -> tuple | None:
    return None if call is None else (incident.role(call.group), call.seq)


def _own_group(incident: Incident, m: int, role: tuple) -> str | None:
    return next((g.key for g in incident.groups_of(m) if incident.role(g.key) == role), None)


def _others_all_there(incident: Incident, call: Call, absent: dict[int, Absent]) -> bool:
    """Whether every other member of call's group is in that call (dumped and held there, or placed there)."""
    for r in incident.groups[call.group].ranks:
        if r == call.rank:
            continue
        if r in absent:
            other = absent[r].held
        else:
            other = incident.ranks[r].held
        if other is None or other.group != call.group or other.seq != call.seq:
            return False
    return True


def _text(incident: Incident, absent: Absent) -> str:
    m = absent.rank
    made = (f"its peers' dumps show it made {len(absent.proven)} call{'s' if len(absent.proven) != 1 else ''}, the "
            f"last {absent.proven[-1].describe(incident.groups)}") if absent.proven else \
        "its peers' dumps show no call it finished"
    if absent.gone and absent.held is not None:
        g = incident.groups[absent.held.group]
        there = [r for r in g.ranks if r != m and incident.ranks[r].dumped]
        also = " (as the other ranks without a dump would)" if len(there) < len(g.ranks) - 1 else ""
        who = f"rank{'s' if len(there) > 1 else ''} {_ranks_text(there)} of {g.describe()}"
        return (f"rank {m} left no dump (it died, exited, or could not write one); {made}; {who} wait"
                f"{'' if len(there) > 1 else 's'} in {absent.held.op} #{absent.held.seq}{also}, which would have "
                f"completed had it been there: it never got there")
    if absent.held is not None and absent.twins:
        return (f"rank {m} left no dump (lost, or it could not write one); {made}; like rank"
                f"{'s' if len(absent.twins) > 1 else ''} {_ranks_text(absent.twins)}, which made as many calls, it "
                f"is taken to wait in {absent.held.op} #{absent.held.seq} on "
                f"{incident.groups[absent.held.group].describe()}")
    if absent.held is not None:
        return (f"rank {m} left no dump (lost, or it could not write one); {made}; it is taken to wait in "
                f"{absent.held.op} #{absent.held.seq} on {incident.groups[absent.held.group].describe()}, its next "
                f"call there, where its peers wait and which could not complete even with it")
    if absent.twins:
        return (f"rank {m} left no dump; {made}; like rank{'s' if len(absent.twins) > 1 else ''} "
                f"{_ranks_text(absent.twins)}, which made as many calls, it is taken to be in no collective")
    return f"rank {m} left no dump (it died, exited, or could not write one, or the file was lost); {made}"


def unrecorded_holds(incident: Incident) -> dict[int, Call]:
    """Ranks in no collective whose next call in the program is on a group where a member went past that very
    call: they wait for that member where Flight Recorder records nothing, before the call's entry (a group's
    creation: new_group, init_device_mesh, split_group; or NCCL setting its communicator up at its first
    collective). Each is taken to be held in that call, so that the one rule sees whom it waits for."""
    sequences = {r: [order_key(incident, c) for c in rec.calls] for r, rec in incident.ranks.items() if rec.dumped}
    order = ProgramOrder(incident)
    out: dict[int, Call] = {}
    for rank, record in incident.ranks.items():
        if not record.dumped or record.held is not None:
            continue
        following = _next_in_program(sequences, rank)
        group = next((g for g in incident.groups_of(rank) if following is not None
                      and incident.role(g.key) == following[0]), None)
        if following is None or group is None or record.issued(group.key) != following[1] - 1:
            continue
        if any(_went_past(incident, order, m, group.key, following[1]) for m in group.ranks
               if m != rank and incident.ranks[m].dumped):
            like = next(c for rec in incident.ranks.values() for c in rec.calls if order_key(incident, c) == following)
            out[rank] = Call(rank, group.key, following[1], like.op, like.in_sizes, like.out_sizes, like.in_dtypes,
                             like.out_dtypes, IN_FLIGHT, "unrecorded", like.site, -1, 0, like.ops, like.p2p)
    return out


def order_key(incident: Incident, call: Call) -> tuple:
    return (incident.role(call.group), call.seq)


def _next_in_program(sequences: dict[int, list[tuple]], rank: int) -> tuple | None:
    """The call that follows the rank's last one in most ranks' sequences."""
    mine = sequences.get(rank) or []
    if not mine:
        return None
    votes = Counter(seq[seq.index(mine[-1]) + 1] for r, seq in sequences.items()
                    if r != rank and mine[-1] in seq[:-1])
    ranked = votes.most_common(2)
    return ranked[0][0] if ranked and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]) else None


def _went_past(incident: Incident, order: Any, m: int, group: str, seq: int) -> Call | None:
    """m's call that the program makes after call #seq of `group`, where m never made #seq."""
    record = incident.ranks[m]
    count = record.issued(group)
    if count is None or count >= seq:
        return None
    wanted = (incident.role(group), seq)
    return next((c for c in record.calls if order.precedes(wanted, order.key(c))), None)
