"""What the dumps cannot show: calls that Flight Recorder counts but does not record.

gloo's Flight Recorder records no send or recv (torch 2.13), yet every call a rank makes on a group moves that
group's op_id: a collective's op_id minus its collective_seq_id is how many calls the rank made on the group before
it that the dump does not show (a pipeline's sends and receives on the default group). A rank in no recorded call
of a job that made such calls may wait in one of them rather than stall: only its Python stack shows which peer it
waits for. Members of one group of a sibling part (the replicas of a dp group) run the same program, so where they
made different numbers of unrecorded calls before the same recorded one, one of them skipped or added one.
"""

from __future__ import annotations

from .records import Incident, _ranks_text


def unrecorded(incident: Incident) -> dict[int, dict[str, tuple[int, int]]]:
    """rank -> base group name -> (calls the dump does not show before the rank's last recorded collective on that
    group, that collective's position): gloo only (NCCL records its point-to-point calls)."""
    out: dict[int, dict[str, tuple[int, int]]] = {}
    if incident.backend != "gloo":
        return out
    for rank, record in incident.ranks.items():
        for call in record.calls:
            if call.p2p or call.op_id <= 0 or call.ops:
                continue
            hidden = call.op_id - call.seq
            if hidden > 0:
                out.setdefault(rank, {})[incident.groups[call.group].name] = (hidden, call.seq)
    return out


def unseen_text(incident: Incident, counts: dict[int, dict[str, tuple[int, int]]]) -> str:
    """The calls the record cannot show, in words ("" where the dumps show every call)."""
    if not counts:
        return ""
    ranks = sorted(counts)
    return (f"gloo's Flight Recorder records no send or recv, and rank{'s' if len(ranks) > 1 else ''} "
            f"{_ranks_text(ranks)} made calls it did not record (a collective's op_id runs ahead of its "
            "collective_seq_id)")


def twins_apart(incident: Incident, counts: dict[int, dict[str, tuple[int, int]]]) -> list[str]:
    """Members of one group of a sibling part (replicas: a dp group) that made different numbers of unrecorded
    calls on a group before the same recorded call there."""
    notes = []
    for key, group in incident.groups.items():
        if incident.role(key)[0] == "group" or len(group.ranks) < 2:
            continue
        for name in sorted({n for r in group.ranks for n in counts.get(r, {})}):
            made = {r: counts[r][name] for r in group.ranks if name in counts.get(r, {})}
            if len(made) < 2 or len({seq for _, seq in made.values()}) > 1 or len({n for n, _ in made.values()}) < 2:
                continue
            said = ", ".join(f"rank {r} {n}" for r, (n, _) in sorted(made.items()))
            notes.append(f"the members of {group.describe()} run the same program, yet before their collective #"
                         f"{next(iter(made.values()))[1]} on group {name} they made different numbers of calls "
                         f"that the dumps do not show ({said}): one of them skipped or added a send or recv")
    return notes
