"""The plan of a DTensor redistribution, in pure Python: torch 2.13's greedy transforms
(``generate_greedy_transform_infos``), the moves they make, the collective each move issues, and torch's merge of
consecutive collectives of one kind into one collective on a flattened mesh (``_optimize_transform_infos``).
meshsim.model.dtensor carries the moves out on every member's block.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..spec.placements import Placement


def is_shard(p: Placement, dim: int | None = None) -> bool:
    return p[0] == "S" and (dim is None or p[1] == dim)


def greedy_transforms(src: list[Placement], dst: list[Placement],
                      mesh_shape: tuple[int, ...]) -> list[tuple[int, Placement, Placement]]:
    """generate_greedy_transform_infos: (mesh dim, current, target) steps, nested shardings unwound first, but only
    when the source is split in more than one piece (torch's `src_spec.num_shards > 1`: a Shard on mesh dims of
    size 1 alone does not count, and then Partial -> Shard goes straight to a reduce_scatter)."""
    current, out = list(src), []
    if len(src) == 1:
        return [(0, src[0], dst[0])] if src[0] != dst[0] else []
    if math.prod(n for p, n in zip(src, mesh_shape) if p[0] == "S") > 1:
        for d in reversed(range(len(current))):
            target = dst[d]
            if target[0] == "S":
                before_now = [i for i in range(d) if is_shard(current[i], target[1])]
                before_then = [i for i in range(d) if is_shard(dst[i], target[1])]
                if before_now != before_then:
                    target = ("R",)
            if current[d] != target:
                out.append((d, current[d], target))
                current[d] = target
    for d, target in enumerate(dst):
        if current[d] != target:
            out.append((d, current[d], target))
            current[d] = target
    return out


@dataclass(frozen=True)
class Move:
    """One step of a redistribution on `dims`: one mesh dim, or several that torch merged into one collective on
    a flattened mesh (ascending). A merge of sum and avg Partials reduces as a sum, then divides by avg_scale.
    `logical_dim`: the mesh dim whose logical shape the collective pads to (None: dims[0])."""

    dims: tuple[int, ...]
    current: Placement
    target: Placement
    avg_scale: int = 1
    logical_dim: int | None = None


COMM_KINDS = {("P", "R"): "all_reduce", ("P", "S"): "reduce_scatter", ("S", "R"): "all_gather",
              ("S", "S"): "all_to_all"}
MERGEABLE = ("all_gather", "all_reduce", "reduce_scatter")  # torch leaves all_to_all unmerged


def comm_kind(move: Move) -> str | None:
    """The collective a move makes (None: a local step, R -> S or R -> P)."""
    return COMM_KINDS.get((move.current[0], move.target[0])) if move.current != move.target else None


def plain_moves(src: list[Placement], dst: list[Placement], mesh_shape: tuple[int, ...]) -> list[Move]:
    return [Move((d,), c, t) for d, c, t in greedy_transforms(src, dst, mesh_shape)]


def _same_collective(a: Move, b: Move) -> bool:
    """torch's are_placements_mergeable: the same move, or sum/avg Partials reduced to the same target."""
    if (a.current, a.target) == (b.current, b.target):
        return True
    return a.target == b.target and a.current[0] == b.current[0] == "P" and {a.current[1], b.current[1]} <= {
        "sum", "avg"}


def merged_moves(moves: list[Move], mesh_shape: tuple[int, ...], flattened: Callable[[tuple[int, ...]], bool],
                 logical: list[tuple[int, ...]]) -> list[Move]:
    """torch's _optimize_transform_infos: runs of consecutive collectives of one kind merged into one collective
    on a flattened mesh of the root that covers their dims (`flattened(dims)`), without reordering. `logical`:
    this rank's logical shape per mesh dim (a reduce_scatter merges only where it divides evenly)."""
    out: list[Move] = []
    for run in _runs(moves):
        merged = _merge(run, mesh_shape, flattened, logical)
        out.extend([merged] if merged is not None else run)
    return out


def _runs(moves: list[Move]) -> list[list[Move]]:
    """The moves cut where torch's merge pass cuts them: runs of consecutive mergeable collectives of one kind,
    every other move alone."""
    runs, i = [], 0
    while i < len(moves):
        j = i + 1
        if comm_kind(moves[i]) in MERGEABLE:
            while j < len(moves) and comm_kind(moves[j]) in MERGEABLE and _same_collective(moves[j], moves[i]):
                j += 1
        runs.append(moves[i:j])
        i = j
    return runs


def _merge_order(run: list[Move]) -> tuple[int, ...] | None:
    """The run's mesh dims, ascending, where torch looks a flattened mesh up for it (None: too short, or in an
    order torch does not merge: a reduce_scatter's dims ascending, an all_gather's descending)."""
    if len(run) < 2:
        return None
    kind, dims = comm_kind(run[0]), tuple(m.dims[0] for m in run)
    ascending = tuple(sorted(dims))
    if (kind == "reduce_scatter" and dims != ascending) or (kind == "all_gather" and dims != ascending[::-1]):
        return None
    return ascending


def unsorted_lookup(moves: list[Move], sorted_layout: Callable[[tuple[int, ...]], bool]) -> tuple[int, ...] | None:
    """The mesh dims whose flattened-mesh lookup raises in torch (>= 2.11): _get_flattened_mesh_by_layout slices the
    mesh by those dims' names before it searches, and slicing refuses dims whose layouts, collapsed, are not in the
    root's order ("Mesh dim indices should be in ascending order": a concatenation of a later dim before an
    earlier one), whether or not the root has any flattened mesh. `sorted_layout(dims)`: whether they are."""
    for run in _runs(moves):
        dims = _merge_order(run)
        if dims is not None and not sorted_layout(dims):
            return dims
    return None


def _merge(run: list[Move], mesh_shape: tuple[int, ...], flattened: Callable[[tuple[int, ...]], bool],
           logical: list[tuple[int, ...]]) -> Move | None:
    """try_create_flattened: the one move that replaces `run`, or None where torch keeps them apart."""
    ascending = _merge_order(run)
    if ascending is None:
        return None
    first, kind, dims = run[0], comm_kind(run[0]), tuple(m.dims[0] for m in run)
    if not flattened(ascending):
        return None
    at = first.dims[0]
    if kind in ("all_gather", "reduce_scatter"):
        affected = first.current[1] if kind == "all_gather" else first.target[1]
        at = max(dims, key=lambda d: logical[d][affected])  # the outermost: first of the largest, as torch's max
        if kind == "reduce_scatter" and logical[at][affected] % math.prod(mesh_shape[d] for d in dims):
            return None
    current, scale = first.current, 1
    if current[0] == "P":
        scale = math.prod(mesh_shape[m.dims[0]] for m in run if m.current == ("P", "avg"))
        current = ("P", "sum") if scale > 1 else current
    return Move(ascending, current, first.target, scale if scale > 1 else 1, at)
