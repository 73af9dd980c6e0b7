"""Who hung the job, from the dumps alone: culprits from per-group sequence counts, never from file order.

Flight Recorder numbers each group's collectives on every rank (collective_seq_id), so within a group a
rank's count of issued collectives says how far it got. A rank that waits in the n-th call of a group waits
for the members whose count is below n. Each of those is either

- without a dump: it exited or died (a culprit);
- in no call: it stopped issuing (stalled outside any collective: a straggler), or went past the call and
  finished (it skipped it): a culprit either way, told apart by whether it made a call that the others make
  after the missing one;
- waiting in another call: if the others make the missing call before that one (program order, by the
  majority of the ranks that made both), it went past the missing call (a culprit: it skipped it);
  otherwise it is held up upstream, and the chain goes on from it.

Members that reached the same count with a different call (op, sizes, dtypes) disagree: the minority is
the culprit, unless a member skipped an earlier call of the group, in which case the partners that completed
mismatched calls are its victims, and are described as such.

Everything is keyed by rank and group, and ties are broken by rank, so the answer does not depend on the
order the dump files were listed in. `to_record` turns an incident into meshsim's RunRecord, so that
meshsim's own judge can diagnose it like a live run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .incident import FAILED, TIMED_OUT, Call, Incident, ProgramOrder, _ranks_text

DEAD = "dead rank"
STALLED = "straggler past the deadline"  # meshsim's name for a rank outside any collective past the deadline
SKIPPED = "skipped collective"
MISMATCH = "mismatched collective"
REORDERED = "reordered collectives"
UNKNOWN = "ranks waiting, cause unclear"
PRIORITY = (DEAD, STALLED, SKIPPED, MISMATCH, REORDERED, UNKNOWN)


@dataclass
class Cause:
    rank: int
    kind: str
    group: str | None  # the group of the call it missed or mismatched
    seq: int | None
    text: str

    def to_json(self) -> dict:
        return {"rank": self.rank, "kind": self.kind, "group": self.group, "seq": self.seq, "text": self.text}


@dataclass
class Wait:
    rank: int
    call: Call
    missing: list[int]  # members that have not issued the call
    mismatched: list[int]  # members that issued a different call at the same count

    def to_json(self, incident: Incident) -> dict:
        g = incident.groups[self.call.group]
        return {"rank": self.rank, "call": self.call.op, "state": self.call.state, "group": g.name,
                "group_ranks": list(g.ranks), "desc": g.desc, "mesh_dim": g.dim, "seq": self.call.seq,
                "site": self.call.site, "missing": self.missing, "mismatched": self.mismatched}


@dataclass
class Analysis:
    kind: str
    culprits: list[int]
    causes: list[Cause]
    waits: list[Wait]
    victims: dict[int, str]  # every other rank: where it is and why
    mismatches: list[str]  # collectives that completed although their members' calls differed
    summary: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def headline(self) -> Cause | None:
        return self.causes[0] if self.causes else None

    def to_json(self, incident: Incident) -> dict:
        return {"kind": self.kind, "culprit_ranks": self.culprits, "summary": self.summary,
                "causes": [c.to_json() for c in self.causes],
                "waiting": [w.to_json(incident) for w in self.waits],
                "victims": {str(r): t for r, t in sorted(self.victims.items())},
                "completed_mismatched": self.mismatches, "notes": self.notes}


def analyze(incident: Incident) -> Analysis:
    order = ProgramOrder(incident)
    seen: dict[tuple, tuple[list[int], list[int]]] = {}  # ranks waiting in one call share who they wait for
    waits = [_wait(incident, rank, record.held, seen) for rank, record in incident.ranks.items()
             if record.dumped and record.held is not None]
    causes: dict[int, Cause] = {}
    upstream: dict[int, set[int]] = {}  # waiting rank -> members it waits for that are held up elsewhere
    mismatched_waits: list[Wait] = []
    why: dict[tuple, Cause | None] = {}
    for w in waits:
        for m in w.missing:
            if (w.call.group, w.call.seq, m) not in why:
                why[(w.call.group, w.call.seq, m)] = _why_missing(incident, order, w.call, m)
            cause = why[(w.call.group, w.call.seq, m)]
            if cause is not None:
                causes.setdefault(m, cause)
            else:
                upstream.setdefault(w.rank, set()).add(m)
        if w.mismatched:
            mismatched_waits.append(w)
    for w in mismatched_waits:
        skipped_before = [c for c in causes.values() if c.kind == SKIPPED and c.group == w.call.group
                          and c.seq is not None and c.seq <= w.call.seq]
        if not skipped_before:
            for cause in _disagreement(incident, w):
                causes.setdefault(cause.rank, cause)
    if not causes and upstream:
        causes.update(_cycle(incident, order, waits, upstream))
    if not causes:
        causes.update(_count_deviants(incident, order))
    ordered = sorted(causes.values(), key=lambda c: (PRIORITY.index(c.kind), c.rank))
    kind = ordered[0].kind if ordered else (UNKNOWN if waits else "no hang in the dumps")
    culprits = sorted(causes)
    mismatches, partners = _completed_mismatches(incident, causes)
    victims = _victims(incident, waits, culprits, partners)
    analysis = Analysis(kind, culprits, ordered, waits, victims, mismatches, notes=list(incident.notes))
    analysis.summary = _summary(incident, analysis)
    return analysis


def _wait(incident: Incident, rank: int, call: Call, seen: dict) -> Wait:
    key = (call.group, call.seq, call.signature())
    if key not in seen:
        seen[key] = _absent(incident, call)
    missing, mismatched = seen[key]
    return Wait(rank, call, [m for m in missing if m != rank], [m for m in mismatched if m != rank])


def _absent(incident: Incident, call: Call) -> tuple[list[int], list[int]]:
    """The members of call's group that have not issued it, and those that issued another call there."""
    missing, mismatched = [], []
    for m in incident.groups[call.group].ranks:
        other = incident.ranks[m]
        count = other.issued(call.group)
        theirs = other.at(call.group, call.seq)
        queued = theirs is not None and not theirs.finished and other.held is not None and other.held is not theirs
        if not other.dumped or (count is not None and count < call.seq) or queued:
            missing.append(m)  # not issued, or (NCCL) enqueued behind a call it is held up in
            continue
        if theirs is not None and theirs.signature() != call.signature():
            mismatched.append(m)
    return missing, mismatched


def _why_missing(incident: Incident, order: ProgramOrder, call: Call, m: int) -> Cause | None:
    """Why member m has not issued `call`; None when it is held up upstream (the wait goes on through it)."""
    record = incident.ranks[m]
    g = incident.groups[call.group]
    if not record.dumped:
        return Cause(m, DEAD, call.group, call.seq,
                     f"rank {m} left no dump: it exited or died before {call.describe(incident.groups)}, "
                     f"which its peers wait in")
    count = record.issued(call.group) or 0
    wanted = (incident.role(call.group), count + 1)
    held = record.held
    if held is None:
        later = [c for c in record.calls if not c.p2p and order.precedes(wanted, order.key(c))]
        if later:
            return Cause(m, SKIPPED, call.group, count + 1,
                         f"rank {m} skipped call #{count + 1} on {g.describe()}: it made "
                         f"{later[0].describe(incident.groups)}, which the others make after it, and is in no call")
        last = record.calls[-1].describe(incident.groups) if record.calls else "no call at all"
        return Cause(m, STALLED, call.group, count + 1,
                     f"rank {m} stopped after {last}: it is in no collective, {count} calls into "
                     f"{g.describe()} where its peers wait in #{call.seq} (stalled outside any collective; "
                     f"had it finished instead, Flight Recorder would show the same)")
    if order.precedes(wanted, order.key(held)):
        return Cause(m, SKIPPED, call.group, count + 1,
                     f"rank {m} skipped call #{count + 1} on {g.describe()}: it went on to "
                     f"{held.describe(incident.groups)}, which the others make after it, and waits there")
    return None


def _disagreement(incident: Incident, w: Wait) -> list[Cause]:
    """Members at the same count with different calls: the minority is to blame (all of them on a tie)."""
    g = incident.groups[w.call.group]
    calls = {m: incident.ranks[m].at(w.call.group, w.call.seq) for m in g.ranks if incident.ranks[m].dumped}
    camps: dict[tuple, list[int]] = {}
    for m, c in sorted(calls.items()):
        if c is not None:
            camps.setdefault(c.signature(), []).append(m)
    if len(camps) < 2:
        return []
    biggest = max(len(v) for v in camps.values())
    leaders = [sig for sig, ranks in camps.items() if len(ranks) == biggest]
    odd = [r for sig, ranks in camps.items() if len(leaders) > 1 or sig != leaders[0] for r in ranks]
    majority = calls[camps[leaders[0]][0]]
    out = []
    for r in odd:
        mine = calls[r]
        text = (f"rank {r} made {mine.describe(incident.groups)} where "
                + (f"the others of {g.describe()} made {majority.op} of {majority.in_sizes}"
                   if len(leaders) == 1 else "no two members of the group agree"))
        out.append(Cause(r, MISMATCH, w.call.group, w.call.seq, text))
    return out


def _cycle(incident: Incident, order: ProgramOrder, waits: list[Wait], upstream: dict[int, set[int]]) -> dict:
    """Every wait leads to another rank's wait: calls made in different orders. The ranks whose held call
    breaks the program order of the majority are to blame; with no majority, every rank of the cycle."""
    held = {w.rank: w.call for w in waits}
    blamed: dict[int, Cause] = {}
    for w in waits:
        for m in upstream.get(w.rank, ()):
            if m in held and order.precedes(order.key(held[m]), order.key(w.call)) is False:
                continue
            if m in held and order.precedes(order.key(w.call), order.key(held[m])) is None:
                blamed.setdefault(m, Cause(m, REORDERED, w.call.group, w.call.seq,
                                           f"rank {m} waits in {held[m].describe(incident.groups)} while "
                                           f"rank {w.rank} waits for it in {w.call.describe(incident.groups)}: "
                                           f"the two make these calls in opposite orders"))
    return blamed


def _count_deviants(incident: Incident, order: ProgramOrder) -> dict[int, Cause]:
    """Nobody waits (every dump ended outside a collective): ranks whose count on a group differs from the
    count most members of that role reached are the culprits."""
    out: dict[int, Cause] = {}
    counts: dict[tuple, dict[int, int]] = {}
    for key, g in incident.groups.items():
        role = incident.role(key)
        for m in g.ranks:
            count = incident.ranks[m].issued(key)
            if count is not None:
                counts.setdefault(role, {})[m] = count
    for role, by_rank in counts.items():
        tally = Counter(by_rank.values()).most_common()
        if len(tally) < 2 or tally[0][1] == tally[1][1]:
            continue
        norm = tally[0][0]
        for m, count in sorted(by_rank.items()):
            if count < norm:
                out.setdefault(m, Cause(m, STALLED, None, count + 1,
                                        f"rank {m} made {count} calls on {incident.role_text(role)} where most "
                                        f"made {norm}"))
    return out


def _completed_mismatches(incident: Incident, causes: dict[int, Cause]) -> tuple[list[str], dict[int, str]]:
    """Collectives every member finished although their calls differ (different op, sizes, dtypes, or made
    from different lines): the partners of a rank that skipped complete the wrong call with it."""
    texts, partners = [], {}
    for key, g in incident.groups.items():
        members = [m for m in g.ranks if incident.ranks[m].dumped]
        depth = max((incident.ranks[m].issued(key) or 0 for m in members), default=0)
        for seq in range(1, depth + 1):
            calls = {m: incident.ranks[m].at(key, seq) for m in members}
            if any(c is None or not c.finished for c in calls.values()) or len(calls) < 2:
                continue
            shapes = {(c.signature(), c.site) for c in calls.values()}
            if len(shapes) < 2:
                continue
            parts = "; ".join(f"rank {m}: {c.op} {list(map(list, c.in_sizes))} at {c.site}"
                              for m, c in sorted(calls.items()))
            texts.append(f"#{seq} on {g.describe()} completed with different calls ({parts})")
            skippers = [c.rank for c in causes.values() if c.kind == SKIPPED and c.group == key]
            for m, c in calls.items():
                if m not in causes and skippers:
                    partners.setdefault(m, f"completed #{seq} on {g.describe()} ({c.op} at {c.site}) paired with "
                                           f"a different call of rank {_ranks_text(skippers)}, which had skipped one")
    return texts, partners


def _victims(incident: Incident, waits: list[Wait], culprits: list[int], partners: dict[int, str]) -> dict[int, str]:
    held = {w.rank: w for w in waits}
    out = {}
    for rank, record in incident.ranks.items():
        if rank in culprits:
            continue
        if not record.dumped:
            out[rank] = "left no dump"
            continue
        w = held.get(rank)
        if w is None:
            text = "finished its calls; it waits in none"
        else:
            how = {FAILED: "was held in", TIMED_OUT: "timed out in"}.get(w.call.state, "waits in")
            text = f"{how} {w.call.describe(incident.groups)}"
            if w.call.state == FAILED:
                text += " until gloo raised (a member had left)"
            if w.missing:
                text += f" for rank{'s' if len(w.missing) > 1 else ''} {_ranks_text(w.missing)}"
            if w.mismatched:
                who = f"rank{'s' if len(w.mismatched) > 1 else ''} {_ranks_text(w.mismatched)}"
                text += f"; {who} made another call there"
            queued = record.queued
            if queued:
                text += f"; {len(queued)} more call{'s' if len(queued) > 1 else ''} queued behind it"
        if rank in partners:
            text += "; earlier it " + partners[rank]
        out[rank] = text
    return out


def _summary(incident: Incident, analysis: Analysis) -> str:
    if not analysis.causes:
        if analysis.waits:
            return f"{analysis.kind}: {len(analysis.waits)} ranks wait, and no rank can be named as the cause."
        return "no rank waits in a collective in these dumps, and every group's counts agree: no hang to explain."
    lead = analysis.causes[0]
    more = f" (and {len(analysis.causes) - 1} more cause{'s' if len(analysis.causes) > 2 else ''})" \
        if len(analysis.causes) > 1 else ""
    waiting = len(analysis.waits)
    return (f"{analysis.kind}: {lead.text}{more}. {waiting} rank{'s' if waiting != 1 else ''} wait"
            f"{'s' if waiting == 1 else ''}. Culprit ranks: {', '.join(map(str, analysis.culprits))}.")


def to_record(incident: Incident, analysis: Analysis | None = None, deadline: float = 0.0) -> Any:
    """The incident as meshsim's RunRecord (meshsim.run.record), so that meshsim's judge diagnoses it as it
    diagnoses a live run: a waiting rank is STUCK in its call (a CallBegun on its group, that group's seq from
    0), a stalled one STUCK in none, one without a dump DIED, the rest FINISHED; call_log maps every recorded
    (group, seq) to (site, op), and calls_on counts each group's calls."""
    from ..run.record import RankState, RunRecord
    from ..wire import DIED, FINISHED, STUCK, CallBegun

    analysis = analysis or analyze(incident)
    stalled = {c.rank for c in analysis.causes if c.kind == STALLED}
    states, stacks = [], {}
    for rank in range(incident.world):
        record = incident.ranks[rank]
        state = RankState(rank, step=0, op="script")
        for key, g in incident.groups.items():
            if rank in g.ranks:
                state.created[key] = tuple(g.ranks)
                state.created_as[key] = g.desc
        state.groups_created = sum(1 for g in incident.groups.values() if g.desc != "default_pg")
        state.meshes = [(0, m.shape, m.names, tuple(range(incident.world))) for m in incident.meshes]
        if not record.dumped:
            state.end = DIED
            state.output = "left no Flight Recorder dump"
            states.append(state)
            continue
        for call in record.calls:
            if call.p2p:
                continue
            state.call_log[(call.group, call.seq - 1)] = (call.site or "?", call.op)
            state.calls_on[call.group] = max(state.calls_on.get(call.group, 0), call.seq)
        held = record.held
        if held is not None:
            g = incident.groups[held.group]
            state.call = CallBegun(held.op, tuple(g.ranks), held.group, held.seq - 1, _context(incident, g, rank))
            state.end = STUCK
            stacks[rank] = _stack_text(incident, rank, held)
        elif rank in stalled:
            state.end = STUCK
        else:
            state.end, state.done = FINISHED, True
        states.append(state)
    source = (f"replayed from Flight Recorder dumps in {incident.directory} (version {incident.version}, "
              f"{incident.backend})")
    notes = [source, *incident.notes]
    return RunRecord(incident.world, deadline, states, 0.0, True, stacks, tier="replay", notes=notes)


def _context(incident: Incident, g: Any, rank: int) -> tuple | None:
    if g.mesh is None:
        return None
    mesh = incident.meshes[g.mesh]
    coordinate: list = mesh.coordinate(rank)
    coordinate[list(mesh.names).index(g.dim)] = "*"
    return (f"mesh{g.mesh}", g.dim, coordinate)


def _stack_text(incident: Incident, rank: int, call: Call) -> str:
    """The held call's frames as Python prints a stack, so meshsim's report groups ranks by them."""
    lines = [f"Flight Recorder stack of rank {rank}'s {call.op} (most recent call first):"]
    lines += [f'  File "{filename}", line {line} in {name}' for name, filename, line in call.frames]
    return "\n".join(lines)
