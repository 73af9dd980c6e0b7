"""Sibling groups' members that gloo's dumps cannot show, completed where the dumps show a skip.

gloo records a group's members only through the calls they make on it (meshsim.replay.incident), so a rank that
skipped its group's only call shows in no group. Pure Python, no torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from .records import Group, Incident, _ranks_text


def complete_siblings(incident: Incident) -> None:
    """Sibling groups (one line calls on each, no rank in common) whose recorded members leave out a few ranks of
    the world, where the dumps show those ranks skipped the line: `new_subgroups` (and enumerations written
    like it) split the world into groups of one size, so each lacks as many members as it falls short of that
    size, and the ranks no sibling shows are those members. Taken only with the evidence of a skip: every group
    to fill has a member held in its call there, each rank to place left a dump and is held where a member that
    finished its sibling call went next, and groups end with 3 members or more (any two ranks are "strided").
    Which rank fills which group the dumps do not say; where exactly one way to fill them makes every group
    evenly strided (ranks i, i + k, ...), that is taken, and said in a note; otherwise the groups stay as
    recorded. Groups that are not a partition of the world (another role's ranks beside them) can still be
    filled wrongly where all of this holds: the note names the ranks placed so."""
    parts: dict[str, list[Group]] = {}
    for key, first in incident.siblings.items():
        parts.setdefault(first, []).append(incident.groups[key])
    for groups in parts.values():
        if any(g.complete for g in groups) or incident.world % len(groups) or incident.world // len(groups) < 3:
            continue
        size = incident.world // len(groups)
        unseen = sorted(set(range(incident.world)) - {r for g in groups for r in g.ranks})
        short = [size - len(g.ranks) for g in groups]
        if not unseen or min(short) < 0 or sum(short) != len(unseen) or len(unseen) > 6:
            continue
        if not all(_held_on(incident, g) for g, n in zip(groups, short) if n) or \
                not all(_went_past(incident, groups, r) for r in unseen):
            continue
        strided = [fill for fill in _fills(unseen, short) if all(_evenly_strided(set(g.ranks) | set(extra))
                                                                 for g, extra in zip(groups, fill))]
        if len(strided) != 1:
            continue
        for g, extra in zip(groups, strided[0]):
            if extra:
                g.ranks, g.source = tuple(sorted(set(g.ranks) | set(extra))), "calls+siblings"
                incident.notes.append(
                    f"{g.describe()}: rank{'s' if len(extra) > 1 else ''} {_ranks_text(list(extra))} taken as "
                    f"member{'s' if len(extra) > 1 else ''} though no call of {'theirs' if len(extra) > 1 else 'its'}"
                    f" there is recorded: its {len(groups)} sibling groups split the world of {incident.world} "
                    f"into groups of {size}, this is the one way to fill them that keeps each evenly strided, and "
                    f"{'they are' if len(extra) > 1 else 'it is'} held past the line its members wait at")


def _held_on(incident: Incident, group: Group) -> bool:
    """A recorded member's last call is on the group and unfinished."""
    return any((last := incident.ranks[r].last) is not None and last.group == group.key and not last.finished
               for r in group.ranks if r in incident.ranks)


def _went_past(incident: Incident, groups: list[Group], rank: int) -> bool:
    """The rank left a dump and is held at a line a member of the siblings reached after finishing its call on
    one of them: it is past the siblings' line."""
    record = incident.ranks.get(rank)
    last = record.last if record is not None and record.dumped else None
    if last is None or last.site is None:
        return False
    keys = {g.key for g in groups}
    for g in groups:
        for m in g.ranks:
            calls = incident.ranks[m].calls if m in incident.ranks else []
            done = [i for i, c in enumerate(calls) if c.group in keys and c.finished]
            if done and any(c.site == last.site for c in calls[done[0] + 1:]):
                return True
    return False


def _fills(unseen: list[int], short: list[int]) -> Iterable[list[tuple[int, ...]]]:
    """Every way to hand the unseen ranks out, short[i] of them to group i."""
    if not short:
        yield []
        return
    for chosen in itertools.combinations(unseen, short[0]):
        rest = [r for r in unseen if r not in chosen]
        for tail in _fills(rest, short[1:]):
            yield [chosen, *tail]


def _evenly_strided(ranks: set[int]) -> bool:
    ordered = sorted(ranks)
    return len({b - a for a, b in itertools.pairwise(ordered)}) <= 1
