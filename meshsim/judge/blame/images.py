"""Images: the one program every rank runs, seen through the cluster's symmetries.

A symmetry is a renumbering of the ranks that maps every group the run called on onto a group it called on: a
shift of a mesh's coordinates (each tp group onto the next host's, each dp pair onto its neighbour), a shift of
every rank by a host's worth, an exchange of halves. SPMD code run on rank r makes, call for call, what it makes on
r's image, with every group renamed by the symmetry. So each rank's calls, in the order it made them, are compared
with its images': the first position where the two differ is where one of them departs from the program.

- A renumbering under which more than a quarter of the ranks (and more than two) differ is not the program's (a
  shift along a pipeline, or of a world of send/recv pairs: one culprit makes two ranks differ under the
  program's own).
- A rank that differs from most of its images, at least two, departs (a rank that left a loop early, the rank
  that called on the wrong pair, each host's local rank 0 adding a call): whichever side waits.
- Where a rank has one image only (two pipelines, two hosts), the side whose call at the first difference never
  completed, or completed with partners that named another root (gloo lets such a broadcast through), departs,
  where its image's call completed with its partners as one call: that is what the program makes there.
- Where a departing rank's images make a send or receive at a line it never called at (a first stage, which
  receives nothing, against the shifts of a pipeline whose last stage sends round to it), its part of the program
  may simply lack that line: this rule says nothing.
- Anything else (both sides held, no symmetry, groups whose members the record does not know): this rule says
  nothing, and the group-by-group rules decide.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

from ...core.outcome import KINDS
from ...core.ranks import group_text, ranks_text
from ...core.record import RankState
from ...core.wire import FINISHED, POINT_TO_POINT, channel_ends
from .calls import Cause, blocked_call, site_text

MAX_RANKS = 256  # beyond this the record's hangs are a plan tier's, and its groups' own rules are enough
MAX_WORK = 4_000_000  # calls compared in all, at most: a bound on the time this rule may take

# a group: ("group", its members, which of the groups of those members it is, in the order they were made), or
# ("channel", (src, dst, tag))
Element = tuple[Any, ...]
Call = tuple[str, Element, Any]  # (the call's kind, its group, its root's place among the members, if it has one)


def image_causes(states: list[RankState]) -> dict[int, Cause]:
    """The ranks whose calls depart from their images', each with what it did; {} where the images cannot say."""
    if not isinstance(states, list):  # a model's rank classes: a class's state stands for ranks with other groups
        return {}
    world = len(states)
    groups = _groups(states)
    if not 2 <= world <= MAX_RANKS or groups is None or not all(_whole(s) for s in states):
        return {}
    traces = [[(s.call_log[(g, q)][1], groups[g], _root_at(groups[g], s.roots.get((g, q)))) for g, q in s.issued]
              for s in states]
    longest = max((len(t) for t in traces), default=0)
    budget = max(1, MAX_WORK // max(1, world * max(1, longest)))
    symmetries = list(itertools.islice(_symmetries(states, set(groups.values()), world), budget))
    if not symmetries:
        return {}
    differences = _differences(states, traces, symmetries)
    if not differences:
        return {}
    departing = _by_majority(states, differences) or _by_completion(states, differences)
    if not departing or any(_a_part_apart(states, r, differences[r]) for r in departing):
        return {}
    return {r: _cause(states, traces, r, differences[r]) for r in sorted(departing)}


def _groups(states: list[RankState]) -> dict[str, Element] | None:
    """Every called group's identity, as a symmetry sees it: its members, and which group of those members it is
    (a metrics group made of every rank is not the mesh's world dim: a rank that calls on the one where its peers
    call on the other departs), by the order the groups were made in; a point-to-point channel: its ends, in
    order. None where a called group's members are not known (a replay of dumps that name none)."""
    known = _identities(states)
    out: dict[str, Element] = {}
    for s in states:
        for group in s.calls_on:
            if group in out:
                continue
            ends = channel_ends(group)
            if ends is not None:
                out[group] = ("channel", ends)
            elif group in known:
                out[group] = known[group]
            else:
                return None
    return out


def _identities(states: list[RankState]) -> dict[str, Element]:
    """The identity of every group whose members the record knows (see _groups)."""
    known: dict[str, tuple[int, ...]] = {}
    for s in states:
        known.update(s.created)
        known.update(s.group_ranks)
    alike: dict[frozenset[int], list[str]] = {}
    for group in sorted((g for g, ranks in known.items() if ranks), key=_made_order):
        alike.setdefault(frozenset(known[group]), []).append(group)
    return {group: ("group", members, n) for members, groups in alike.items() for n, group in enumerate(groups)}


def _made_order(group: str) -> tuple[int, str]:
    """torch names a process group by the count of groups made before it (the default group "0"); other names
    (hashed, a replay's own) sort after, by name."""
    return (int(group), "") if group.isdigit() else (1 << 62, group)


def _whole(state: RankState) -> bool:
    """Whether the record holds every call the rank made (a Flight Recorder's ring buffer keeps the last ones:
    positions in two ranks' sequences then say nothing)."""
    seen: dict[str, int] = {}
    for group, seq in state.issued:
        if seq != seen.get(group, 0):
            return False
        seen[group] = seq + 1
    return True


def _root_at(group: Element, root: int | None) -> int | None:
    """A root by its place among its group's members, in order: SPMD code names the group's first member (group
    rank 0, the coordinate 0 of a dim), which a shift of coordinates does not keep as a global rank."""
    if root is None or group[0] != "group" or root not in group[1]:
        return root
    return sorted(group[1]).index(root)


def _moved(group: Element, perm: tuple[int, ...]) -> Element:
    """A group renamed by a symmetry."""
    if group[0] == "channel":
        ends = group[1]
        return ("channel", (perm[ends[0]], perm[ends[1]], *ends[2:]))  # (src, dst, tag)
    return ("group", frozenset(perm[r] for r in group[1]), group[2])


def _mapped(call: Call, perm: tuple[int, ...]) -> Call:
    """A call renamed by a symmetry: the same kind, on the group's image."""
    return (call[0], _moved(call[1], perm), call[2])


def _symmetries(states: list[RankState], called: set[Element], world: int) -> Iterator[tuple[int, ...]]:
    """Renumberings that map every called group onto a called group: mesh coordinate shifts first (the meshes the
    ranks built), then shifts of every rank."""
    seen: set[tuple[int, ...]] = {tuple(range(world))}
    plain = [g for g in called if g[0] == "group"]
    for perm in itertools.chain(_mesh_shifts(states, world), _rank_shifts(world)):
        if perm not in seen:
            seen.add(perm)
            if all(_moved(g, perm) in called for g in plain):
                yield perm


def _mesh_shifts(states: list[RankState], world: int) -> Iterator[tuple[int, ...]]:
    meshes = {(tuple(shape), tuple(ranks)) for s in states for _, shape, _, ranks in s.meshes}
    for shape, ranks in sorted(meshes):
        if not shape or len(ranks) != _product(shape) or any(r >= world for r in ranks):
            continue
        coords = list(itertools.product(*(range(n) for n in shape)))
        index = {c: i for i, c in enumerate(coords)}
        for offset in coords[1:]:
            perm = list(range(world))
            for i, c in enumerate(coords):
                moved = tuple((a + b) % n for a, b, n in zip(c, offset, shape))
                perm[ranks[i]] = ranks[index[moved]]
            yield tuple(perm)


def _rank_shifts(world: int) -> Iterator[tuple[int, ...]]:
    """Every rank moved on by k (a host's worth, a pipeline's): a shift keeps the direction a pipeline's stages
    pass things in, where a reflection (an exchange of ranks) would not."""
    for k in range(1, world):
        yield tuple((r + k) % world for r in range(world))


def _product(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


class Difference:
    """Rank r against its image under one symmetry: where their calls first differ (None: they agree)."""

    def __init__(self, image: int, perm: tuple[int, ...], at: int | None):
        self.image, self.perm, self.at = image, perm, at


def _differences(states: list[RankState], traces: list[list[Call]],
                 symmetries: list[tuple[int, ...]]) -> dict[int, list[Difference]]:
    """Every rank against each of its images; {} where no two ranks differ at all. A renumbering under which more
    than a quarter of the ranks (and more than two) differ from their images maps the groups but not the program
    (a shift along a pipeline dim takes the last stage to the first): it is left out."""
    out: dict[int, list[Difference]] = {}
    any_differ = False
    for perm in symmetries:
        found = [Difference(perm[r], perm, _first_difference(states, trace, traces[perm[r]], perm, r, perm[r]))
                 for r, trace in enumerate(traces) if perm[r] != r]
        differing = sum(d.at is not None for d in found)
        if differing > max(2, len(traces) // 4):  # (one culprit and its preimage: two)
            continue
        for d in found:
            out.setdefault(_inverse(perm)[d.image], []).append(d)
        any_differ = any_differ or differing > 0
    return out if any_differ else {}


def _first_difference(states: list[RankState], mine: list[Call], theirs: list[Call], perm: tuple[int, ...],
                      r: int, image: int) -> int | None:
    """The first position where rank r's calls, renamed by perm, differ from its image's; where one is a prefix of
    the other, the end of the shorter if that rank finished (it left without the call), else None (behind)."""
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if _mapped(a, perm) != b:
            return i
    shorter = min(len(mine), len(theirs))
    if len(mine) != len(theirs):
        short_one = r if len(mine) < len(theirs) else image
        if states[short_one].end == FINISHED:
            return shorter
    return None


def _by_majority(states: list[RankState], differences: dict[int, list[Difference]]) -> set[int]:
    """Ranks that differ from most of their images (two at least), where every pair that differs holds one. A
    difference where the rank's call completed as one call of its group and its image's never did does not count
    against the rank: its partners made that call with it, so it is the program's there (a pipeline whose every
    stage waits at its first call differs, under each shift, from the stage that passed its data on)."""
    departing = set()
    for r, diffs in differences.items():
        differ = sum(d.at is not None and not (_sound(states, r, d.at) and not _sound(states, d.image, d.at))
                     for d in diffs)
        if differ >= 2 and differ > len(diffs) - differ:
            departing.add(r)
    pairs = [(r, d.image) for r, diffs in differences.items() for d in diffs if d.at is not None]
    if not departing or any(r not in departing and image not in departing for r, image in pairs):
        return set()
    if 2 * len(departing) >= len(differences):
        return set()
    return departing


def _by_completion(states: list[RankState], differences: dict[int, list[Difference]]) -> set[int]:
    """For every pair that differs: the side whose call at the first difference never completed soundly (_sound),
    where its image's did. Every pair must say, and no rank may be on both sides."""
    departing: set[int] = set()
    kept: set[int] = set()
    for r, diffs in differences.items():
        for d in diffs:
            if d.at is None:
                continue
            mine, theirs = _sound(states, r, d.at), _sound(states, d.image, d.at)
            if mine == theirs:
                return set()
            departing.add(d.image if mine else r)
            kept.add(r if mine else d.image)
    return set() if departing & kept or 2 * len(departing) >= len(states) else departing


def _sound(states: list[RankState], r: int, at: int) -> bool:
    """Whether rank r's call at that position completed as one call of its group: every member that made that call
    made the same kind with the same root (gloo completes a broadcast whose members name different roots, each
    sending: a call that completed that way is no evidence of the program)."""
    if not _completed(states[r], at):
        return False
    key = states[r].issued[at]
    if states[r].call_log[key][1] in POINT_TO_POINT:  # a channel's send and recv: each end its own kind
        return True
    mine = (states[r].call_log[key][1], states[r].roots.get(key))
    return all((s.call_log[key][1], s.roots.get(key)) == mine for s in states if key in s.call_log)


def _completed(state: RankState, at: int) -> bool:
    """Whether the rank's call at that position of its sequence completed (a rank that finished made no call
    there: its program ended, which completes nothing)."""
    if at >= len(state.issued):
        return False
    key = state.issued[at]
    call = blocked_call(state)
    return not (call is not None and (call.group, call.seq) == key) and key not in state.in_flight


def _cause(states: list[RankState], traces: list[list[Call]], r: int, diffs: list[Difference]) -> Cause:
    """What rank r did where it departs, against its images' call there, in words; the cause names the call its
    peers wait in for it (the one it skipped, or made on another group), or the call it added."""
    at, d = _where(diffs)
    images = sorted({d.image for d in diffs if d.at == at})
    several = len(images) > 1
    theirs = (f"rank{'s' if several else ''} {ranks_text(images)} (its image{'s' if several else ''} under the "
              f"cluster's symmetries, which run{'' if several else 's'} its part of the program)")
    make = "make" if several else "makes"
    usual, wanted = _usual(states, traces, d, at)
    expected = _named(states, wanted[1] if wanted is not None else None)
    state = states[r]
    if at >= len(state.issued):
        go = "go" if several else "goes"
        return Cause(r, KINDS["left"], f"rank {r} finished after {at} calls, where {theirs} {go} on to {usual}",
                     expected, state.calls_on.get(expected, 0) if expected else None)
    group, seq = state.issued[at]
    site, kind = state.call_log[(group, seq)]
    made = f"{kind} #{seq} on group {group_text(_ranks(traces[r][at]))} at {site_text(site)}"
    how, added = _how(states, traces, r, d, at)
    if not added and expected is not None:
        group, seq = expected, state.calls_on.get(expected, 0)
    return Cause(r, how[0], f"rank {r} made {made} as its call {at + 1}, where {theirs} {make} {usual}{how[1]}",
                 group, seq)


def _where(diffs: list[Difference]) -> tuple[int, Difference]:
    """Where rank r departs (the position most of its differing images name) and one image that names it."""
    at = Counter(d.at for d in diffs if d.at is not None).most_common(1)[0][0]
    return at, next(d for d in diffs if d.at == at)


def _a_part_apart(states: list[RankState], r: int, diffs: list[Difference]) -> bool:
    """Whether rank r's images, where it departs, make a send or receive at a line r never made a call at: a
    pipeline's first stage, which never receives, under a shift that takes a last stage sending round to it for
    a ring's. Its part of the program may have no such line; the images cannot tell it from a skip."""
    at, d = _where(diffs)
    image = states[d.image]
    if at >= len(image.issued) or at >= len(states[r].issued):
        return False
    site, kind = image.call_log[image.issued[at]]
    return kind in POINT_TO_POINT and site is not None and all(
        mine != site for mine, _ in states[r].call_log.values())


def _usual(states: list[RankState], traces: list[list[Call]], d: Difference, at: int
           ) -> tuple[str, Call | None]:
    """The image's call at that position in words, and the call renamed back into the departing rank's frame."""
    image = states[d.image]
    if at >= len(image.issued):
        return "none (it finished)", None
    group, seq = image.issued[at]
    site, kind = image.call_log[(group, seq)]
    back = _mapped(traces[d.image][at], _inverse(d.perm))
    theirs, mine = group_text(_ranks(traces[d.image][at])), group_text(_ranks(back))
    here = f" (group {mine} for this rank)" if mine != theirs else ""
    return f"{kind} #{seq} on group {theirs}{here} at {site_text(site)}", back


def _named(states: list[RankState], element: Element | None) -> str | None:
    """The name of the group (or channel) that is `element`."""
    if element is None:
        return None
    if element[0] == "channel":
        return next((g for s in states for g in s.calls_on if channel_ends(g) == element[1]), None)
    return next((name for name, known in sorted(_identities(states).items()) if known == element), None)




def _how(states: list[RankState], traces: list[list[Call]], r: int, d: Difference, at: int
         ) -> tuple[tuple[str, str], bool]:
    """The kind of departure, in words, and whether rank r added its call (else it skipped the images' call, or made
    it on another group, or made another): its next call is the images' call here (added), its call here is their
    next (skipped), where the two calls stand in the program (a later line of the file, a later plan step: skipped),
    the same call at the same place on another group, else which of them it made more often than its images."""
    mine = [_mapped(e, d.perm) for e in traces[r]]
    theirs = traces[d.image]
    if at + 1 < len(mine) and mine[at + 1] == theirs[at]:
        return (KINDS["mismatched"], ": it added a call the program does not make there"), True
    if at + 1 < len(theirs) and mine[at] == theirs[at + 1]:
        return (KINDS["skipped"], ": it skipped that call (its call here is the one they make next)"), False
    later = _later(_site(states[r], at), _site(states[d.image], at))
    if later is None and _kind(states[r], at) == _kind(states[d.image], at):
        return (KINDS["mismatched"], ": the same call on another group than its images'"), False
    if later is None:
        later = _count(mine[: at + 1], mine[at]) <= _count(theirs[: at + 1], mine[at])
    if later:
        return (KINDS["skipped"], ": it went on to a call the program makes later, without the one here"), False
    return (KINDS["mismatched"], ": it added a call the program does not make there"), True


def _kind(state: RankState, at: int) -> str | None:
    return state.call_log[state.issued[at]][1] if at < len(state.issued) else None


def _site(state: RankState, at: int) -> Any:
    return state.call_log[state.issued[at]][0] if at < len(state.issued) else None


def _later(mine: Any, theirs: Any) -> bool | None:
    """Whether `mine` stands after `theirs` in the program: a later line of the same file, a later plan step."""
    if isinstance(mine, int) and isinstance(theirs, int):
        return None if mine == theirs else mine > theirs
    if isinstance(mine, str) and isinstance(theirs, str):
        (file_a, _, line_a), (file_b, _, line_b) = mine.rpartition(":"), theirs.rpartition(":")
        if file_a == file_b and line_a.isdigit() and line_b.isdigit() and line_a != line_b:
            return int(line_a) > int(line_b)
    return None


def _count(trace: list[Call], call: Call) -> int:
    return sum(1 for c in trace if c == call)


def _ranks(call: Call) -> list[int]:
    return sorted(call[1][1])


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)
