"""Hangs in group creation: meshes that differ across ranks, groups skipped on some ranks, names that drifted."""

from __future__ import annotations

from typing import Any

from ...core.outcome import KINDS
from ...core.ranks import group_text, ranks_text
from ...core.record import RankState
from ...core.wire import CallBegun
from .calls import Blame, missing_from


def creation_blame(states: list[RankState], held: dict[int, CallBegun]) -> Blame:
    diverged = _mesh_divergence(states)
    if diverged is not None:
        return diverged
    drifted = _drift(states)
    if drifted is not None:
        return drifted
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


def _drift(states: list[RankState]) -> Blame | None:
    """The same group (its ranks) created under different names: torch names a group by a counter that every
    new_group call moves, members or not, so the ranks whose name for it is the earlier one skipped a new_group
    before it (the classic `if rank in members: new_group(members)`): they are to blame."""
    names: dict[tuple[int, ...], dict[int, list[int]]] = {}  # a group's ranks -> rank -> its names for it
    for s in states:
        for name, ranks in s.created.items():
            if name.isdigit():
                names.setdefault(ranks, {}).setdefault(s.rank, []).append(int(name))
    for ranks, by_rank in sorted(names.items()):
        camps: dict[tuple[int, ...], list[int]] = {}
        for rank, numbers in sorted(by_rank.items()):
            camps.setdefault(tuple(sorted(numbers)), []).append(rank)
        if len(camps) < 2 or len({len(key) for key in camps}) > 1:
            continue  # one name for it everywhere, or created more often on some ranks (not a drift)
        ordered = sorted(camps)
        behind, later = camps[ordered[0]], sorted(r for key in ordered[1:] for r in camps[key])
        many, others = ("s" if len(behind) > 1 else ""), ("s" if len(later) > 1 else "")
        note = (f"Group {group_text(ranks)} is group {ordered[0][0]} on rank{many} {ranks_text(behind)} but group "
                f"{ordered[-1][0]} on rank{others} {ranks_text(later)}: rank{many} {ranks_text(behind)} skipped a "
                "new_group before it (every rank must call new_group, members or not).")
        return Blame(KINDS["subset"], behind, note)
    return None


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
        later = _built_at_a_later_step(states, k, built)
        if later:
            return Blame(KINDS["subset"], later, note)
        return Blame(KINDS["inconsistent"], _smaller_camps(list(camps.values())), note)
    return None


def _built_at_a_later_step(states: list[RankState], k: int, built: dict[Any, list[int]]) -> list[int]:
    """In a plan, the ranks whose k-th mesh is a later step's than the other ranks' k-th: they skipped the earlier
    step's mesh, whose groups the others wait to create (with no rank past it, nothing else tells)."""
    steps: dict[Any, set[Any]] = {key: {states[r].meshes[k][0] for r in ranks} for key, ranks in built.items()}
    if any(len(found) != 1 or not isinstance(next(iter(found)), int) for found in steps.values()):
        return []  # a script's meshes (no plan steps), or a camp spread over steps
    first = min(next(iter(found)) for found in steps.values())
    return sorted(r for key, ranks in built.items() if next(iter(steps[key])) > first for r in ranks)


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
