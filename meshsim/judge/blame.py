"""Who is to blame when a run does not finish: one rule for plans, user functions, scripts, torchrun and replays.

Culprits follow from the record (meshsim.record), not from who happens to be waiting:
- a rank that died, or raised outside any collective, is a culprit;
- a rank whose collective raised because a peer left is a victim of that peer;
- a rank stalled outside any collective that others wait for is a straggler, and a culprit;
- among the members of a group that others wait on, the rank whose sequence of calls there parts from the
  others' is the culprit: it issued fewer (it skipped, or left), more (an extra call), or another call at the
  first position where the members disagree. A rank that waits, or that completed a mismatched collective
  because its partner skipped one, is a victim, and the diagnosis says what it did.
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

from ..ranks import ranks_text
from ..record import RankState, RunRecord
from ..wire import DIED, RAISED, STUCK, CallBegun

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
    "unknown": "ranks waiting, cause unclear",
}


@dataclass
class Blame:
    """The kind of failure, its culprits, and what the others did (rank -> words)."""

    kind: str
    culprits: list[int]
    note: str = ""
    victims: dict[int, str] = field(default_factory=dict)


def same_call(a: CallBegun | None, b: CallBegun | None) -> bool:
    """Whether two ranks are in the same blocking call (same group, same position on it)."""
    if a is None or b is None:
        return False
    if a.kind == "new_group":
        return b.kind == "new_group" and b.group == a.group and b.ranks == a.ranks
    return b.kind == a.kind and b.group == a.group and b.seq == a.seq


def blocked_call(state: RankState) -> CallBegun | None:
    """The call a rank is held in: the one it waits in, or the one that raised on it."""
    if state.end == STUCK and state.call is not None:
        return state.call
    if state.end == RAISED and state.failed_in is not None:
        return state.failed_in
    return None


def missing_from(call: CallBegun, states: list[RankState]) -> list[int]:
    """The members of `call`'s group that are not in that same call."""
    return [m for m in call.ranks if m < len(states) and not same_call(call, blocked_call(states[m]))]


def blame(record: RunRecord, divergent: Iterable[int] = (), size_evidence: Iterable[int] = ()) -> Blame:
    """The one rule (see the module's docstring). `divergent`: ranks a plan makes diverge (a tie-breaker only);
    `size_evidence`: ranks the model saw pass other tensor sizes to one collective."""
    states = record.states
    died = [s.rank for s in states if s.end == DIED]
    if died:
        return Blame(KINDS["dead"], died)
    left_outside = [s.rank for s in states if s.end == RAISED and s.failed_in is None]
    if left_outside:
        return Blame(KINDS["raised"], left_outside)
    held = {s.rank: call for s in states if (call := blocked_call(s)) is not None}
    stalled = [s.rank for s in states if s.end == STUCK and s.call is None]
    waited_for = {m for r, call in held.items() for m in missing_from(call, states)}
    late = [r for r in stalled if r in waited_for or not held]
    if late:
        return Blame(KINDS["straggler"], late, victims=_waiting_for(held, late))
    if not held:
        return Blame(KINDS["unknown"], [])
    evidence = sorted(set(size_evidence))
    if evidence:
        return Blame(KINDS["size"], evidence, victims=_waiting_for(held, evidence))
    if any(call.kind == "new_group" for call in held.values()):
        return _creation(states, held)
    return _collectives(states, held, set(divergent))


def _waiting_for(held: dict[int, CallBegun], culprits: list[int]) -> dict[int, str]:
    out = {}
    for rank, call in held.items():
        if rank not in culprits:
            out[rank] = f"waits in {call.kind} on group {list(call.ranks)}"
    return out


# ------------------------------------------------------------------------------------------ collectives


def _collectives(states: list[RankState], held: dict[int, CallBegun], divergent: set[int]) -> Blame:
    """Follow who waits for whom to the roots; on each root's group, compare the members' call sequences.

    A rank whose missing peers are all held on *other* groups is only downstream of the problem. With no root at
    all, ranks wait on each other across groups: calls made in a different order.
    """
    def downstream(rank: int) -> bool:
        missing = missing_from(held[rank], states)
        return bool(missing) and all(m in held and held[m].group != held[rank].group for m in missing)

    roots = {call.group: call for rank, call in sorted(held.items()) if not downstream(rank)}
    if not roots:
        return _reordered(held, divergent)
    culprits: set[int] = set()
    kinds: list[str] = []
    victims: dict[int, str] = {}
    for call in roots.values():
        found = _sequence_culprits(states, call, divergent)
        culprits |= set(found.culprits)
        kinds.append(found.kind)
        victims.update(found.victims)
    if not culprits:
        culprits = {m for call in roots.values() for m in missing_from(call, states)}
    if not culprits:  # every member is in the call and it raised: the call itself failed on each of them
        raised = sorted(r for r in held if states[r].end == RAISED)
        if raised:
            return Blame(KINDS["raised"], raised)
    kind = KINDS["mismatched"] if KINDS["mismatched"] in kinds else \
        KINDS["left"] if kinds and all(k == KINDS["left"] for k in kinds) else KINDS["skipped"]
    for rank, call in held.items():
        if rank not in culprits and rank not in victims:
            victims[rank] = f"waits in {call.kind} #{call.seq} on group {list(call.ranks)}"
    return Blame(kind, sorted(culprits), victims={r: v for r, v in victims.items() if r not in culprits})


def _reordered(held: dict[int, CallBegun], divergent: set[int]) -> Blame:
    camps = Counter(call.group for call in held.values())
    (first, _), = camps.most_common(1)
    minority = sorted(rank for rank, call in held.items() if call.group != first)
    culprits = sorted(divergent & set(held)) or minority or sorted(held)
    return Blame(KINDS["reordered"], culprits, victims=_waiting_for(held, culprits))


def _sequence_culprits(states: list[RankState], call: CallBegun, divergent: set[int]) -> Blame:
    """On `call`'s group, the members whose sequence of calls parts from the others' first."""
    group, members = call.group, [m for m in call.ranks if m < len(states)]
    seqs = {m: states[m].sequence(group) for m in members}
    depth = max(len(s) for s in seqs.values())
    for k in range(depth):
        at = {m: (seqs[m][k] if k < len(seqs[m]) else None) for m in members}
        camps: dict[Any, list[int]] = {}
        for m, entry in at.items():
            camps.setdefault(entry, []).append(m)
        if len(camps) < 2:
            continue
        odd = _odd_camps(camps, seqs, k, states, divergent)
        return Blame(_kind_at(camps, odd, at, states), odd, victims=_victims(seqs, k, odd, at, states))
    return Blame(KINDS["skipped"], [])


def _odd_camps(camps: dict[Any, list[int]], seqs: dict[int, list[Any]], k: int, states: list[RankState],
               divergent: set[int]) -> list[int]:
    """The ranks outside the largest camp; between camps of equal size: who skipped by the sites, then the plan's
    divergent ranks, then those that stopped calling on the group."""
    largest = max(len(ranks) for ranks in camps.values())
    leaders = [entry for entry, ranks in camps.items() if len(ranks) == largest]
    if len(leaders) == 1:
        return sorted(m for entry, ranks in camps.items() if entry != leaders[0] for m in ranks)
    skipped = [entry for entry in leaders if entry is not None and _is_ahead(entry, camps, seqs, k)]
    if len(skipped) == 1:
        return sorted(camps[skipped[0]])
    odd = sorted(m for ranks in camps.values() for m in ranks if m in divergent)
    if odd:
        return odd
    if None in camps:
        return sorted(camps[None])
    return sorted(m for ranks in camps.values() for m in ranks)


def _is_ahead(entry: Any, camps: dict[Any, list[int]], seqs: dict[int, list[Any]], k: int) -> bool:
    """Whether the camp that made `entry` at position k skipped a call: what it made there is what every other
    camp makes next, at k + 1 (sites must say where calls come from for this to tell anything)."""
    site, _ = entry
    if site is None:
        return False
    for other, ranks in camps.items():
        if other == entry:
            continue
        nexts = {tuple(seqs[m][k + 1]) if k + 1 < len(seqs[m]) else None for m in ranks}
        if nexts != {tuple(entry)}:
            return False
    return True


def _kind_at(camps: dict[Any, list[int]], odd: list[int], at: dict[int, Any], states: list[RankState]) -> str:
    if any(at[m] is None for m in odd):
        gone = all(at[m] is None and states[m].end != STUCK for m in odd)
        return KINDS["left"] if gone and all(states[m].done for m in odd) else KINDS["skipped"]
    kinds = {entry[1] for entry in camps if entry is not None}
    return KINDS["mismatched"] if len(kinds) > 1 else KINDS["skipped"]


def _victims(seqs: dict[int, list[Any]], k: int, odd: list[int], at: dict[int, Any],
             states: list[RankState]) -> dict[int, str]:
    """What the others did at the position where the culprits parted: a rank that completed a call there, paired
    with a culprit's other call, completed a mismatched collective; the rest wait."""
    out: dict[int, str] = {}
    for m, entry in at.items():
        if m in odd or entry is None:
            continue
        partners = [o for o in odd if at[o] is not None and at[o] != entry]
        if len(seqs[m]) > k + 1 and partners:
            theirs = ", ".join(f"rank {o}'s {at[o][1]} at {_site(at[o][0])}" for o in partners[:3])
            out[m] = (f"completed {entry[1]} #{k} at {_site(entry[0])} paired with {theirs}: a mismatched "
                      "collective, because its partner skipped or added one")
    return out


def _site(site: Any) -> str:
    return f"step {site}" if isinstance(site, int) else str(site)


# ------------------------------------------------------------------------------------------ group creation


def _creation(states: list[RankState], held: dict[int, CallBegun]) -> Blame:
    diverged = _mesh_divergence(states)
    if diverged is not None:
        return diverged
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
