"""The parts groups play in the program, and the program order the ranks' calls follow.

Every group made by one mesh dim plays one part, as do groups that one line of code calls on with no rank in
common (new_subgroups, an enumeration); a call is named by its group's part and its position on the group, so that
ranks compare calls they made on different groups of one part.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ...core.record import RankState
from ...core.wire import POINT_TO_POINT


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
            votes = self._votes(first, then)
            self._cache[(first, then)] = None if votes[True] == votes[False] else votes[True] > votes[False]
        return self._cache[(first, then)]

    def _votes(self, first: Any, then: Any) -> Counter[bool]:
        votes: Counter[bool] = Counter()
        for positions in self.position:
            a, b = positions.get(first), positions.get(then)
            if a is not None and b is not None:
                votes[a < b] += 1
        return votes


class StateOrder(ProgramOrder):
    """The program order of a record's ranks. Where no rank made both of two calls (one rank went past the call
    its peers wait in, to one none of them reached yet), a loop's earlier iteration tells: the same two parts'
    calls, each an equal number of calls back."""

    LOOKBACK = 3  # iterations back

    def __init__(self, states: list[RankState]):
        self.roles = roles_of(states)
        super().__init__([self.key(group, seq) for group, seq in s.issued] for s in states)
        self._states = states
        self._earlier: dict[tuple[Any, Any], bool | None] = {}

    def key(self, group: str, seq: int) -> tuple[Any, int]:
        return (self.roles.get(group, group), seq)

    def precedes(self, first: Any, then: Any) -> bool | None:
        found = super().precedes(first, then)
        if found is not None:
            return found
        if (first, then) not in self._earlier:  # (a tie is no evidence to look past)
            self._earlier[(first, then)] = None if self._votes(first, then) else self._by_earlier(first, then)
        return self._earlier[(first, then)]

    def _by_earlier(self, first: tuple[Any, int], then: tuple[Any, int]) -> bool | None:
        for back in range(1, self.LOOKBACK + 1):
            if min(first[1], then[1]) < back:
                break
            earlier_first, earlier_then = (first[0], first[1] - back), (then[0], then[1] - back)
            if not (self._same_line(first, earlier_first) and self._same_line(then, earlier_then)):
                continue  # (not the loop's same two calls: a call at a line of its own is no iteration's)
            earlier = super().precedes(earlier_first, earlier_then)
            if earlier is not None:
                return earlier
        return None

    @functools.cached_property
    def sites(self) -> dict[tuple[Any, int], set[Any]]:
        """A call of the program -> the lines it was made at (read only where no rank made both of two calls)."""
        sites: dict[tuple[Any, int], set[Any]] = {}
        for s in self._states:
            for (group, seq), (site, _) in s.call_log.items():
                sites.setdefault(self.key(group, seq), set()).add(site)
        return sites

    def _same_line(self, key: tuple[Any, int], earlier: tuple[Any, int]) -> bool:
        """Both made at one line, the same (a call its members made at different lines is in dispute, no loop's)."""
        lines = self.sites.get(key, set()) - {None}
        return len(lines) == 1 and lines == self.sites.get(earlier, set()) - {None}


def roles_of(states: list[RankState]) -> dict[str, Any]:
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
    """The parts of the groups with no mesh dim (sibling_parts): groups one line of code calls on, groups one line
    created (new_subgroups, an enumeration, a loop of new_group), groups given one description."""
    members: dict[str, frozenset[int]] = {}
    at: dict[Any, set[str]] = {}
    for s in states:
        for group, ranks in s.created.items():
            members.setdefault(group, frozenset(ranks))
            if group in roles:
                continue
            if s.created_at.get(group) is not None:
                at.setdefault(("created at", s.created_at[group]), set()).add(group)
            desc = s.created_as.get(group)
            if desc and desc not in UNDESCRIBED:
                at.setdefault(("described", desc), set()).add(group)
        for (group, _), (site, kind) in s.call_log.items():
            if group not in roles and site is not None and kind not in POINT_TO_POINT:
                at.setdefault((site, kind), set()).add(group)
                members[group] = members.get(group, frozenset()) | {s.rank}
    return sibling_parts(at, members)


UNDESCRIBED = ("undefined", "default_pg", "mesh_default")  # torch's descriptions of groups nobody described


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


class Reference:
    """What the program makes at each position of each part, by the ranks that play it (siblings included): for a
    group whose members disagree, the groups of its part elsewhere say which call SPMD code makes there."""

    def __init__(self, states: list[RankState], roles: dict[str, Any]):
        self.roles = roles
        self.states = states
        self.group_of: dict[Any, dict[int, str]] = {}  # part -> rank -> its one group of that part
        several: set[tuple[Any, int]] = set()
        for s in states:
            for group in s.calls_on:
                part = self.part(group)
                mine = self.group_of.setdefault(part, {})
                if mine.get(s.rank, group) != group:
                    several.add((part, s.rank))
                mine[s.rank] = group
        for part, rank in several:  # a rank with two groups of one part has no one sequence there
            del self.group_of[part][rank]

    def part(self, group: str) -> Any:
        return self.roles.get(group, group)

    def entry(self, rank: int, part: Any, seq: int) -> Any:
        """The call (site, kind) the rank made at position seq of its group of that part (None: none)."""
        group = self.group_of.get(part, {}).get(rank)
        return None if group is None else self.states[rank].call_log.get((group, seq))

    def count(self, rank: int, part: Any) -> int | None:
        group = self.group_of.get(part, {}).get(rank)
        return None if group is None else self.states[rank].calls_on.get(group, 0)

    def ranks(self, part: Any, exclude: Iterable[int] = ()) -> list[int]:
        left = set(exclude)
        return sorted(r for r in self.group_of.get(part, {}) if r not in left)

    def program(self, part: Any, seq: int, exclude: Iterable[int] = ()) -> Any:
        """The call most of the part's ranks (but `exclude`) made at position seq; None where none did, or the
        most made two calls there equally often."""
        votes = Counter(e for r in self.ranks(part, exclude) if (e := self.entry(r, part, seq)) is not None)
        top = votes.most_common(2)
        if not top or (len(top) > 1 and top[0][1] == top[1][1]):
            return None
        return top[0][0]

    def counts(self, part: Any, exclude: Iterable[int] = ()) -> Counter[int]:
        """How many calls the part's ranks (but `exclude`) made on their groups of it."""
        return Counter(c for r in self.ranks(part, exclude) if (c := self.count(r, part)) is not None)

    def usual(self, part: Any, exclude: Iterable[int] = ()) -> int | None:
        """How many calls most of the part's ranks (but `exclude`) made on their groups of it; None where none
        has a group of the part."""
        top = self.counts(part, exclude).most_common(1)
        return top[0][0] if top else None

    def made_more(self, rank: int, part: Any, exclude: Iterable[int] = ()) -> bool:
        """Whether the rank made more calls on its group of the part than most of the part's ranks did."""
        usual = self.usual(part, exclude)
        return usual is not None and (self.count(rank, part) or 0) > usual

    def describe(self, part: Any) -> str:
        if isinstance(part, tuple) and part and part[0] == "dim":
            return f"mesh dim {part[1]!r}"
        if isinstance(part, tuple) and part and part[0] == "siblings":
            return "sibling groups"
        return f"group {part}"
