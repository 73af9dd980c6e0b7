"""Sibling groups' members that gloo's dumps cannot show, completed where the dumps show a skip.

gloo records a group's members only through the calls they make on it (meshsim.replay.incident), so a rank that
skipped its group's only call shows in no group. Pure Python, no torch.
"""

from __future__ import annotations

import itertools
from collections import Counter
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
                not all(_went_past(incident, groups, r) for r in unseen) or \
                any(_chained(incident, g) for g in groups):
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


def _chained(incident: Incident, group: Group) -> bool:
    """The group is called at a line where a group that shares a rank with it is called too: the links of a
    pipeline (each stage sends on its downstream link at the line where its upstream neighbour sends on its own),
    which one stage's own line can make look like siblings, and which never split the world."""
    calls = [c for record in incident.ranks.values() for c in record.calls]
    sites = {c.site for c in calls if c.group == group.key and c.site is not None}
    others = {c.group for c in calls if c.site in sites and c.group != group.key}
    return any(set(incident.groups[o].ranks) & set(group.ranks) for o in others if o in incident.groups)


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


def complete_by_creation_order(incident: Incident) -> None:
    """Groups made one after another by one loop (`[new_group([s, s + 1]) for s in ...]`: a pipeline's links) have
    consecutive names and members that move by a fixed step from one to the next. Where the groups of such a run
    known from their calls all fit one rule (member j of group k is a_j + b_j * k) and one of them shows fewer
    members, a member that never called there is the rule's: taken where a recorded member is held on the group
    and each rank added has pg_ids that count it a member (its pg_id on a later group counts the groups it is in
    before it, the default group 0 included), and said in a note."""
    numbered = sorted((int(g.name), g) for g in incident.groups.values() if g.name.isdigit() and g.source == "calls")
    for run in _consecutive_runs(numbered):
        size = Counter(len(g.ranks) for _, g in run).most_common(1)[0][0]
        full = [(k, sorted(g.ranks)) for k, g in run if len(g.ranks) == size]
        rule = _linear_rule(full)
        if rule is None or len(full) < 3 or len(full) == len(run):
            continue
        for k, g in run:
            predicted = {a + b * k for a, b in rule}
            extra = sorted(predicted - set(g.ranks))
            if len(g.ranks) >= size or not set(g.ranks) < predicted or not _held_on(incident, g) or \
                    not all(0 <= r < incident.world and _counted_in(incident, r, k) for r in extra):
                continue
            g.ranks, g.source = tuple(sorted(predicted)), "calls+creation order"
            incident.notes.append(
                f"{g.describe()}: rank{'s' if len(extra) > 1 else ''} {_ranks_text(extra)} taken as member"
                f"{'s' if len(extra) > 1 else ''} though no call of {'theirs' if len(extra) > 1 else 'its'} there "
                f"is recorded: the groups made just before and after it step their members by one rule, and "
                f"{'their' if len(extra) > 1 else 'its'} pg_ids count one group more than the dumps show")


def _consecutive_runs(numbered: list[tuple[int, Group]]) -> list[list[tuple[int, Group]]]:
    runs: list[list[tuple[int, Group]]] = []
    for k, g in numbered:
        if runs and runs[-1][-1][0] == k - 1:
            runs[-1].append((k, g))
        else:
            runs.append([(k, g)])
    return [run for run in runs if len(run) >= 4]


def _linear_rule(full: list[tuple[int, list[int]]]) -> list[tuple[int, int]] | None:
    """(a_j, b_j) for each member position j such that member j of group k is a_j + b_j * k, from the first two
    groups and held by every other; None where none holds."""
    if len(full) < 2:
        return None
    (k0, m0), (k1, m1) = full[0], full[1]
    steps = [(b - a, k1 - k0) for a, b in zip(m0, m1)]
    if any(d % n for d, n in steps):
        return None
    rule = [(a - (d // n) * k0, d // n) for a, (d, n) in zip(m0, steps)]
    return rule if all(members == [a + b * k for a, b in rule] for k, members in full) else None


def _counted_in(incident: Incident, rank: int, name: int) -> bool:
    """The rank's pg_id on some later group of its own counts group `name` among its groups (the default group is
    its pg_id 0); False where no recorded pg_id says so."""
    record = incident.ranks.get(rank)
    if record is None:
        return False
    member_of = {int(g.name) for g in incident.groups.values() if g.name.isdigit() and rank in g.ranks}
    for pg_id, key in record.pg_ids.items():
        later = incident.groups.get(key)
        if later is None or not later.name.isdigit() or int(later.name) <= name:
            continue
        before = {n for n in member_of if n < int(later.name)} | {0}
        if pg_id == len(before) + 1 and name not in before:
            return True
    return False
