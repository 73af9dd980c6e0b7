"""Who hung the job, from the dumps alone: meshsim's one culprit rule (meshsim.judge.blame), never file order.

`to_record` turns an incident into the record a live run would have left (meshsim.core.record): every rank's calls on
every group in the order it issued them, the call each waiting rank is held in, the sizes it passed. The judge
then names culprits from per-group sequence counts and the program order the majority of ranks followed: a rank
without a dump died; one that went past a call the others wait in skipped it; one in no call stalled; members at
the same position with another call disagree, the minority to blame. What only the dumps can say (a call's
state, its sizes, the calls queued behind it, collectives that completed with different calls) is added here
as description.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.outcome import KINDS
from .records import FAILED, TIMED_OUT, Call, Incident, _ranks_text

DEAD, STALLED, SKIPPED = KINDS["dead"], KINDS["straggler"], KINDS["skipped"]
MISMATCH, REORDERED, UNKNOWN = KINDS["mismatched"], KINDS["reordered"], KINDS["unknown"]
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
    culprits_at: dict[int, str] = field(default_factory=dict)  # each culprit's last recorded call, and where
    candidates: list[Cause] = field(default_factory=list)  # the evidence cannot decide: who may be, and why
    note: str = ""  # the rule's own word on it (meshsim.judge.blame.Blame.note)

    @property
    def headline(self) -> Cause | None:
        return self.causes[0] if self.causes else None

    def to_json(self, incident: Incident) -> dict:
        return {"kind": self.kind, "culprit_ranks": self.culprits, "summary": self.summary,
                "culprits_at": {str(r): t for r, t in sorted(self.culprits_at.items())},
                "causes": [c.to_json() for c in self.causes],
                "waiting": [w.to_json(incident) for w in self.waits],
                "victims": {str(r): t for r, t in sorted(self.victims.items())},
                "candidates": [c.to_json() for c in self.candidates],
                "completed_mismatched": self.mismatches, "notes": self.notes}


def analyze(incident: Incident) -> Analysis:
    """The incident judged by meshsim's one culprit rule (meshsim.judge.blame), on the record the dumps make
    (to_record), and described with what only the dumps say (the states, sizes and queues of the calls)."""
    from ..judge.blame import blame
    from .unrecorded import twins_apart, unrecorded

    found = blame(to_record(incident))
    seen: dict[tuple, tuple[list[int], list[int]]] = {}  # ranks waiting in one call share who they wait for
    waits = [_wait(incident, rank, held, seen) for rank, record in incident.ranks.items()
             if record.dumped and (held := record.held or incident.unrecorded.get(rank)) is not None]
    causes = [_absent_cause(incident, c) for c in found.causes]  # seq: Flight Recorder's collective_seq_id
    culprits = found.culprits
    kind = causes[0].kind if causes else found.kind if found.culprits else \
        (UNKNOWN if waits else "no hang in the dumps")
    mismatches, partners = _completed_mismatches(incident, {c.rank: c for c in causes})
    victims = _victims(incident, waits, culprits + [c.rank for c in found.candidates], partners)
    analysis = Analysis(kind, culprits, causes, waits, victims, mismatches, notes=list(incident.notes),
                        candidates=[_absent_cause(incident, c) for c in found.candidates], note=found.note)
    analysis.culprits_at = {r: _last_seen(incident, r) for r in culprits}
    analysis.notes += _stopped_together(incident, analysis) + twins_apart(incident, unrecorded(incident))
    analysis.summary = _summary(incident, analysis)
    return analysis


def _last_seen(incident: Incident, rank: int) -> str:
    """Where the dumps last see a rank: the call it is held in, else its last recorded call."""
    record = incident.ranks[rank]
    if not record.dumped:
        return incident.absent[rank].text if rank in incident.absent else "left no dump"
    if record.held is not None:
        return f"held in {record.held.describe(incident.groups)} ({record.held.state})"
    if rank in incident.unrecorded:
        return f"held before {incident.unrecorded[rank].describe(incident.groups)}, whose entry is not written yet"
    if record.calls:
        return f"in no collective; its last recorded call: {record.calls[-1].describe(incident.groups)}"
    return "in no collective, and its dump records no call"


def _stopped_together(incident: Incident, analysis: Analysis) -> list[str]:
    """Ranks that each stalled are rarely many, and rarely at one place: several ranks outside any recorded call,
    right after the same call, are more likely held together in a call Flight Recorder does not record, which
    the ranks that went on past that place did not make."""
    stalled = [c.rank for c in analysis.causes if c.kind == STALLED]
    lasts = {incident.ranks[r].calls[-1].site if incident.ranks[r].calls else None for r in stalled}
    if len(stalled) < 2 or len(lasts) != 1 or None in lasts:
        return []
    (site,) = lasts
    ahead = sorted({w.rank for w in analysis.waits if w.call.site != site})
    went_on = f"; rank{'s' if len(ahead) > 1 else ''} {_ranks_text(ahead)} went on without them" if ahead else ""
    return [f"ranks {_ranks_text(stalled)} all stopped outside any recorded collective right after the call at "
            f"{site}: rather than {len(stalled)} ranks stalling at one place, they may be held together in what "
            f"Flight Recorder does not record (group creation: new_group, init_device_mesh, split_group; a store "
            f"barrier; gloo's point-to-point calls){went_on}, which would make the rank that skipped it the cause"]


def _absent_cause(incident: Incident, cause: Any) -> Cause:
    """A rank without a dump that the others wait for is to blame as one that left no dump (died, exited, could
    not write one): Flight Recorder cannot tell those apart, nor a stall from them, and says nothing more."""
    absent = incident.absent.get(cause.rank)
    if absent is None or cause.kind not in (DEAD, STALLED, KINDS["left"]):
        return Cause(cause.rank, cause.kind, cause.group, cause.seq, cause.text)
    return Cause(cause.rank, DEAD, cause.group, cause.seq, absent.text)


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
        placed = incident.unrecorded.get(m)
        if placed is not None and (placed.group, placed.seq) == (call.group, call.seq):
            continue  # held in it before its entry is written
        count = other.issued(call.group)
        theirs = other.at(call.group, call.seq)
        queued = theirs is not None and not theirs.finished and other.held is not None and other.held is not theirs
        if not other.dumped or (count is not None and count < call.seq) or queued:
            missing.append(m)  # not issued, or (NCCL) enqueued behind a call it is held up in
            continue
        if theirs is not None and theirs.signature() != call.signature():
            mismatched.append(m)
    return missing, mismatched


def _completed_mismatches(incident: Incident, causes: dict[int, Cause]) -> tuple[list[str], dict[int, str]]:
    """Collectives every member finished although their calls differ (different op, sizes, dtypes, or made
    from different lines): the partners of a rank that skipped complete the wrong call with it."""
    texts: list[str] = []
    partners: dict[int, str] = {}
    for key, g in incident.groups.items():
        members = [m for m in g.ranks if incident.ranks[m].dumped]
        depth = max((incident.ranks[m].issued(key) or 0 for m in members), default=0)
        for seq in range(1, depth + 1):
            found = {m: incident.ranks[m].at(key, seq) for m in members}
            calls = {m: c for m, c in found.items() if c is not None and c.finished}
            if len(calls) < len(found) or len(calls) < 2:
                continue
            # a send and its receive come from different lines by design; a dump without frames has no line
            sites = {c.site for c in calls.values() if c.site is not None and not c.p2p}
            if len({c.signature() for c in calls.values()}) < 2 and len(sites) < 2:
                continue
            parts = "; ".join(f"rank {m}: {c.op} {list(map(list, c.in_sizes))} at {c.site}"
                              for m, c in sorted(calls.items()))
            texts.append(f"#{seq} on {g.describe()} completed with different calls ({parts})")
            # the culprits among its members whose call there is not the others' (a skip, an added call, a call
            # meant for another group)
            for m, c in calls.items():
                odd = sorted(r for r in calls if r in causes and r != m and calls[r].site != c.site)
                if m not in causes and odd:
                    did = {SKIPPED: "which had skipped one"}.get(causes[odd[0]].kind, "which is to blame")
                    partners.setdefault(m, f"completed #{seq} on {g.describe()} ({c.op} at {c.site}) paired with "
                                           f"a different call of rank {_ranks_text(odd)}, {did}")
    return texts, partners


def _victims(incident: Incident, waits: list[Wait], culprits: list[int], partners: dict[int, str]) -> dict[int, str]:
    held = {w.rank: w for w in waits}
    out = {}
    for rank, record in incident.ranks.items():
        if rank in culprits:
            continue
        if not record.dumped:
            out[rank] = incident.absent[rank].text if rank in incident.absent else "left no dump"
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
    if not analysis.causes and analysis.candidates:
        return f"{analysis.kind}: " + "; ".join(c.text for c in analysis.candidates) + f". {analysis.note}"
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


def to_record(incident: Incident, analysis: Analysis | None = None, deadline: float = 0.0) -> Any:  # noqa: ARG001
    """The incident as meshsim's RunRecord (meshsim.core.record), so that meshsim's judge diagnoses it as it
    diagnoses a live run: a waiting rank is STUCK in its call (a CallBegun on its group at Flight Recorder's
    collective_seq_id, so the judge's words count calls as the dumps do), any other rank with a dump STUCK in
    none; call_log maps every recorded (group, seq) to (site, op), issued keeps their order, sizes what each
    passed, and calls_on is one past each group's last seq. A rank without a dump is placed as meshsim.replay.absent
    places it: DIED where it cannot be anywhere its peers' dumps allow, else STUCK where its twins are, with the
    calls its peers prove it made. `analysis` is accepted for callers of the first version and not needed."""
    from ..core.record import RankState, RunRecord
    from ..core.wire import DIED, STUCK

    states, stacks = [], {}
    for rank in range(incident.world):
        record = incident.ranks[rank]
        state = RankState(rank, step=0, op="script")
        for key, g in incident.groups.items():
            if rank in g.ranks:
                state.created[key] = tuple(g.ranks)
                state.created_as[key] = g.desc
                state.calls_on[key] = 1  # collective_seq_id counts from 1: none issued is "one past 0"
        state.group_index = {key: pg_id for key, pg_id in record.pg_id_of.items() if pg_id > 0}
        state.groups_created = sum(1 for g in incident.groups.values() if g.desc != "default_pg")
        state.meshes = [(0, m.shape, m.names, tuple(range(incident.world))) for m in incident.meshes]
        absent = incident.absent.get(rank)
        if not record.dumped and (absent is None or absent.gone):
            state.end = DIED
            state.output = "left no Flight Recorder dump"
            states.append(state)
            continue
        queued = {id(c) for c in record.queued}
        # (NCCL: a call enqueued behind the one the rank is held in has not started)
        calls = [c for c in record.calls if id(c) not in queued]
        held = record.held
        if held is None and rank in incident.unrecorded:
            held = incident.unrecorded[rank]
            calls.append(held)
        if absent is not None:
            calls, held = absent.proven + ([absent.held] if absent.held is not None else []), absent.held
        for call in calls:
            _log(state, call)
        # alive and in no collective: Flight Recorder cannot tell a rank that stalled from one about to exit, so it
        # is held outside any call (the judge names it if the others wait for it)
        state.end = STUCK
        if held is not None:
            state.call = _begun(incident, rank, held)
            stacks[rank] = _stack_text(incident, rank, held)
        states.append(state)
    from .unrecorded import unrecorded, unseen_text

    source = (f"replayed from Flight Recorder dumps in {incident.directory} (version {incident.version}, "
              f"{incident.backend})")
    notes = [source, *incident.notes]
    return RunRecord(incident.world, deadline, states, 0.0, True, stacks, tier="replay", notes=notes,
                     unseen=unseen_text(incident, unrecorded(incident)))


P2P_KIND = "send/recv"  # the judge compares the calls of a pair's group: a send and its receive are one call


def _kind(call: Call) -> str:
    return P2P_KIND if call.p2p else call.op


def _log(state: Any, call: Call) -> None:
    state.call_log[(call.group, call.seq)] = (call.site or "?", _kind(call))
    state.calls_on[call.group] = max(state.calls_on.get(call.group, 0), call.seq + 1)
    state.issued.append((call.group, call.seq))
    if call.in_sizes:
        state.sizes[(call.group, call.seq)] = _sizes(call)
    if call.via is not None:
        state.vias[(call.group, call.seq)] = call.via


def _sizes(call: Call) -> str:
    dtypes = list(call.in_dtypes) + ["?"] * len(call.in_sizes)
    return ",".join(f"{dtype}{list(size)}" for size, dtype in zip(call.in_sizes, dtypes))


def _begun(incident: Incident, rank: int, call: Call) -> Any:
    from ..core.wire import CallBegun

    g = incident.groups[call.group]
    return CallBegun(_kind(call), tuple(g.ranks), call.group, call.seq, _context(incident, g, rank), call.site,
                     _sizes(call) if call.in_sizes else None, via=call.via)


def _context(incident: Incident, g: Any, rank: int) -> tuple | None:
    if g.mesh is None:
        return None
    mesh = incident.meshes[g.mesh]
    coordinate: list = mesh.coordinate(rank)
    coordinate[list(mesh.names).index(g.dim)] = "*"
    return (f"mesh{g.mesh}", g.dim, coordinate)


def _stack_text(incident: Incident, rank: int, call: Call) -> str:
    """The held call's frames as Python prints a stack, so meshsim's report groups ranks by them."""
    if call.fr_state == "inferred":
        return f"no dump: taken to wait in {call.op} as the ranks that made as many calls do"
    if call.fr_state == "unrecorded":
        return f"no entry yet: taken to wait before {call.op}'s entry (group creation or communicator set-up)"
    lines = [f"Flight Recorder stack of {call.op} (most recent call first):"]
    lines += [f'  File "{filename}", line {line} in {name}' for name, filename, line in call.frames]
    return "\n".join(lines)
