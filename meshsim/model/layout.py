"""Index algebra for meshes, pure Python.

A mesh is a view over its root's *rank map* (the root's ranks in row-major order). Each mesh dimension is a
tuple of modes ``(size, stride)``, outermost first, over positions in that rank map: coordinate ``c`` of a
dimension maps to ``sum(c_i * stride_i)`` where ``c_i`` enumerates the modes lexicographically. A dimension
made by flattening non-adjacent dimensions has several modes; an ordinary one has one mode; a size-1
dimension has none. Every dimension is kept in canonical form (size-1 modes dropped, adjacent modes that
enumerate consecutive positions merged), so equal dimensions compare equal.

The positions a whole mesh covers form one *replica*; the root's rank map is tiled by replicas whose base
positions are the smallest positions not yet covered (a slice ``mesh["tp"]`` of a 2x4 mesh has two
replicas: [0..3] and [4..7]).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from itertools import product
from typing import Any, TypeVar, cast

T = TypeVar("T")

Mode = tuple[int, int]
Dim = tuple[Mode, ...]
Layout = tuple[Dim, ...]


class LayoutError(ValueError):
    """The requested layout cannot exist (not decomposable, overlapping)."""


def canonical(modes: tuple[Mode, ...] | list[Mode]) -> Dim:
    """Drop size-1 modes and merge neighbours whose positions continue each other."""
    out: list[list[int]] = []
    for size, stride in reversed([m for m in modes if m[0] != 1]):  # innermost first
        if out and out[-1][0] * out[-1][1] == stride:
            out[-1][0] *= size
        else:
            out.append([size, stride])
    return tuple((s, d) for s, d in reversed(out))


@lru_cache(maxsize=1024)
def row_major(shape: tuple[int, ...]) -> Layout:
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    return tuple(canonical(((s, d),)) for s, d in zip(shape, strides))


@lru_cache(maxsize=4096)
def size_of(dim: Dim) -> int:
    return math.prod(s for s, _ in dim)


@lru_cache(maxsize=4096)
def sizes_of(layout: Layout) -> tuple[int, ...]:
    return tuple(size_of(d) for d in layout)


@lru_cache(maxsize=4096)
def positions(dim: Dim) -> tuple[int, ...]:
    """Positions of a dimension's coordinates, in coordinate order."""
    if not dim:
        return (0,)
    return tuple(sum(c * d for c, (_, d) in zip(coord, dim)) for coord in product(*(range(s) for s, _ in dim)))


def collapse(layout: Layout) -> Dim:
    """All dimensions merged into one, in row-major order of the layout."""
    return canonical(tuple(m for dim in layout for m in dim))


def is_descending(dim: Dim) -> bool:
    """Whether the modes go from outer to inner in the root (strides never grow)."""
    strides = [d for _, d in dim]
    return strides == sorted(strides, reverse=True)


@lru_cache(maxsize=4096)
def is_orthogonal(dim: Dim) -> bool:
    """torch's _FlatLayout.check_orthogonal: with modes sorted by stride (outermost first), each stride is a
    multiple of the next mode's span. Stricter than disjoint: (2 by 3) with (3 by 2) covers six distinct
    positions yet interleaves, and torch refuses it."""
    modes = sorted(((d, s) for s, d in dim), reverse=True)
    return all(modes[i][0] % (modes[i + 1][0] * modes[i + 1][1]) == 0 for i in range(len(modes) - 1))


@lru_cache(maxsize=4096)
def replica_bases(dim: Dim, extent: int) -> tuple[int, ...]:
    """Base positions of the replicas of `dim` that tile [0, extent), smallest first."""
    covered = positions(dim)
    used = bytearray(extent)
    bases = []
    for base in range(extent):
        if used[base]:
            continue
        for p in covered:
            q = base + p
            if q >= extent or used[q]:
                raise LayoutError(f"layout {dim} does not tile {extent} positions")
            used[q] = 1
        bases.append(base)
    return tuple(bases)


@lru_cache(maxsize=4096)
def cell_positions(layout: Layout) -> tuple[int, ...]:
    """Positions of every cell of one replica (base 0), in row-major coordinate order."""
    per_dim = [positions(d) for d in layout]
    return tuple(sum(parts) for parts in product(*per_dim))


def replicas(layout: Layout, rank_map: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every replica's ranks in row-major order of the layout (flat)."""
    cells = cell_positions(layout)
    return [tuple(rank_map[b + p] for p in cells) for b in replica_bases(collapse(layout), len(rank_map))]


def nest(flat: tuple[int, ...] | list[int], shape: tuple[int, ...]) -> Any:
    """Row-major flat list -> nested lists of `shape`."""
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = math.prod(shape[1:])
    return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def dim_groups(dim: Dim, rank_map: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The process groups along one dimension: one per replica of that dimension, in mesh order."""
    return replicas((dim,), rank_map)


def modes_from_positions(pos: tuple[int, ...]) -> Dim:
    """Inverse of positions(): the canonical modes enumerating exactly `pos`, or LayoutError."""
    n = len(pos)
    if n == 1:
        if pos[0] != 0:
            raise LayoutError("a dimension must start at position 0")
        return ()
    if pos[0] != 0:
        raise LayoutError("a dimension must start at position 0")
    stride = pos[1] - pos[0]
    if stride <= 0:
        raise LayoutError(f"positions {pos} are not strided")
    run = 1
    while run < n and pos[run] == run * stride:
        run += 1
    if n % run:
        raise LayoutError(f"positions {pos} are not a product of strided runs")
    for block in range(n // run):
        base = pos[block * run]
        if any(pos[block * run + i] != base + i * stride for i in range(run)):
            raise LayoutError(f"positions {pos} are not a product of strided runs")
    outer = modes_from_positions(pos[::run])
    return canonical(outer + ((run, stride),))


def split(dim: Dim, sizes: tuple[int, ...]) -> Layout:
    """Unflatten: dimension `dim` reshaped row-major into `sizes` (product must match)."""
    pos = positions(dim)
    inner = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    parts = [tuple(pos[c * inner[i]] for c in range(s)) for i, s in enumerate(sizes)]
    for flat, coord in enumerate(product(*(range(s) for s in sizes))):
        if pos[flat] != sum(part[c] for part, c in zip(parts, coord)):
            raise LayoutError(f"dimension {dim} cannot be split into {sizes}")
    return tuple(modes_from_positions(part) for part in parts)


# ------------------------------------------------------------------ shared by every rank of a world
#
# Every rank of a world asks the same questions of the same (layout, rank map): which replicas, which groups,
# where am I. Answering each rank from scratch is O(world) per rank, O(world^2) in all (31 s at 4,096 ranks);
# answering once and indexing by rank keeps the model linear (meshsim's model tier predicts 100,000 ranks).
# Rank maps are large tuples whose hash costs O(world) each time, so they are keyed by identity (the model
# passes a root's rank map on to everything derived from it) and kept alive with the entry.

_SHARED: dict[tuple[str, Layout, int], tuple[tuple[int, ...], Any]] = {}
_SHARED_LIMIT = 512


def forget_shared() -> None:
    """Drop what the last prediction shared (a new plan's rank maps are new objects)."""
    _SHARED.clear()


def _shared(kind: str, layout: Layout, rank_map: tuple[int, ...], build: Callable[[], T]) -> T:
    key = (kind, layout, id(rank_map))
    hit = _SHARED.get(key)
    if hit is not None and hit[0] is rank_map:
        return cast(T, hit[1])
    if len(_SHARED) >= _SHARED_LIMIT:
        _SHARED.clear()
    value = build()
    _SHARED[key] = (rank_map, value)
    return value


def shared_replicas(layout: Layout, rank_map: tuple[int, ...]) -> list[tuple[int, ...]]:
    """replicas(), computed once per (layout, rank map)."""
    return _shared("replicas", layout, rank_map, lambda: replicas(layout, rank_map))


def shared_flat_ranks(layout: Layout, rank_map: tuple[int, ...]) -> tuple[int, ...]:
    """Every replica's ranks, one after another: the mesh tensor DeviceMesh builds groups from, flattened."""
    return _shared("flat", layout, rank_map, lambda: tuple(r for rep in shared_replicas(layout, rank_map) for r in rep))


def shared_dim_groups(dim: Dim, rank_map: tuple[int, ...]) -> list[tuple[int, ...]]:
    return shared_replicas((dim,), rank_map)


def placements(layout: Layout, rank_map: tuple[int, ...]) -> dict[int, list[tuple[int, int]]]:
    """rank -> [(replica index, flat index within it)], every occurrence."""
    def build() -> dict[int, list[tuple[int, int]]]:
        found: dict[int, list[tuple[int, int]]] = {}
        for rep_index, rep in enumerate(shared_replicas(layout, rank_map)):
            for flat, r in enumerate(rep):
                found.setdefault(r, []).append((rep_index, flat))
        return found

    return _shared("placements", layout, rank_map, build)


def shared_view(layout: Layout, rank_map: tuple[int, ...], replica: int) -> list[Any]:
    """One replica as nested lists, the same object for every rank that sees it."""
    def build() -> list[Any]:
        nested: list[Any] = nest(shared_replicas(layout, rank_map)[replica], sizes_of(layout))
        return nested

    return _shared(f"view{replica}", layout, rank_map, build)


@lru_cache(maxsize=64)
def identity_map(n: int) -> tuple[int, ...]:
    """init_device_mesh's rank map, one object per size (see _shared)."""
    return tuple(range(n))


_INTERNED: dict[tuple[int, ...], tuple[int, ...]] = {}


def interned(ranks: tuple[int, ...]) -> tuple[int, ...]:
    """One object for every equal rank map (see _shared, which keys by identity)."""
    if len(_INTERNED) > 1024:
        _INTERNED.clear()
    return _INTERNED.setdefault(ranks, ranks)


class DimInfo:
    """The groups along one dim of a rank map, as DeviceMesh creates them, shared by every rank."""

    def __init__(self, dim: Dim, rank_map: tuple[int, ...], world: int):
        self.groups = shared_dim_groups(dim, rank_map)  # in mesh order
        self.spans_world = len(self.groups[0]) == world
        self.sorted = [tuple(sorted(g)) for g in self.groups]  # torch's group-rank order
        self.members: dict[int, list[int]] = {}  # rank -> indexes of its groups (several: a repeated rank)
        for index, ranks in enumerate(self.groups):
            for r in set(ranks):
                self.members.setdefault(r, []).append(index)
        # (index, message): the first group new_group refuses, where every rank raises
        self.first_invalid = next(((index, why) for index, ranks in enumerate(self.sorted)
                                   if (why := group_refusal(ranks, world)) is not None), None)


def group_refusal(ranks_sorted: tuple[int, ...] | list[int], world: int) -> str | None:
    """Why torch's new_group refuses these (sorted) ranks, or None: the one rule for plan steps and meshes."""
    if len(set(ranks_sorted)) != len(ranks_sorted):
        return "ranks list must not contain duplicate entries"
    if len(ranks_sorted) > world:
        return "the new group's world size should be less or equal"
    bad = [r for r in ranks_sorted if r < 0 or r >= world]
    if bad:
        return f"Rank {bad[0]} is out of range"
    return None


def dim_info(dim: Dim, rank_map: tuple[int, ...], world: int) -> DimInfo:
    return _shared(f"dim{world}", (dim,), rank_map, lambda: DimInfo(dim, rank_map, world))
