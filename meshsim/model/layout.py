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
from typing import Any, TypeVar, cast

import numpy as np

from .expect import Grid

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


@lru_cache(maxsize=256)
def positions(dim: Dim) -> tuple[int, ...]:
    """Positions of a dimension's coordinates, in coordinate order."""
    return tuple(position_array(dim).tolist())


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


Positions = np.ndarray[Any, np.dtype[np.int64]]


@lru_cache(maxsize=256)
def position_array(dim: Dim) -> Positions:
    """positions() as an array (worlds of a million ranks: no Python tuple of them)."""
    out = np.zeros(1, dtype=np.int64)
    for size, stride in dim:
        out = (out[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride).ravel()
    return out


def complement(dim: Dim, extent: int) -> Dim | None:
    """The modes whose positions, added to `dim`'s, cover [0, extent) exactly once (None: no such product)."""
    out: list[Mode] = []
    reached = 1  # positions below this are enumerated by the modes so far (and their complement)
    for size, stride in sorted(dim, key=lambda m: m[1]):
        if stride % reached:
            return None
        if stride > reached:
            out.append((stride // reached, reached))
        reached = stride * size
    if extent % reached:
        return None
    if extent > reached:
        out.append((extent // reached, reached))
    return canonical(tuple(reversed(out)))


@lru_cache(maxsize=256)
def replica_bases(dim: Dim, extent: int) -> Positions:
    """Base positions of the replicas of `dim` that tile [0, extent), smallest first."""
    rest = complement(dim, extent) if is_orthogonal(dim) else None
    if rest is not None:
        return np.sort(position_array(rest))
    covered = positions(dim)  # not a product: tile greedily, smallest uncovered position first
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
    return np.array(bases, dtype=np.int64)


@lru_cache(maxsize=256)
def cell_array(layout: Layout) -> Positions:
    """Positions of every cell of one replica (base 0), in row-major coordinate order."""
    out = np.zeros(1, dtype=np.int64)
    for dim in layout:
        out = (out[:, None] + position_array(dim)[None, :]).ravel()
    return out


def cell_positions(layout: Layout) -> tuple[int, ...]:
    return tuple(cell_array(layout).tolist())


def replicas(layout: Layout, rank_map: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every replica's ranks in row-major order of the layout (flat)."""
    return [tuple(row) for row in geometry(layout, rank_map).table.tolist()]


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
    grid = position_array(dim).reshape(sizes)
    parts = [grid[tuple(slice(None) if j == i else 0 for j in range(len(sizes)))] for i in range(len(sizes))]
    rebuilt = np.zeros(sizes, dtype=np.int64)
    for i, part in enumerate(parts):
        rebuilt += part.reshape(tuple(-1 if j == i else 1 for j in range(len(sizes))))
    if not np.array_equal(rebuilt, grid):
        raise LayoutError(f"dimension {dim} cannot be split into {sizes}")
    return tuple(modes_from_positions(tuple(part.tolist())) for part in parts)




# ------------------------------------------------------------------ shared by every rank of a world
#
# Every rank of a world asks the same questions of the same (layout, rank map): which replicas, which groups,
# where am I. They are answered once per (layout, rank map), as arrays indexed by rank, so the model costs the
# same per rank at a thousand ranks as at a million. Rank maps are large tuples whose hash costs O(world) each
# time, so they are keyed by identity (the model passes a root's rank map on to everything derived from it) and
# kept alive with the entry.

RankArray = np.ndarray[Any, np.dtype[np.int64]]
_SHARED: dict[tuple[str, Any, int], tuple[tuple[int, ...], Any]] = {}
_SHARED_LIMIT = 512


def forget_shared() -> None:
    """Drop what the last prediction shared (a new plan's rank maps are new objects)."""
    _SHARED.clear()
    _PLAN_MAPS.clear()
    _MEMO.clear()


_MEMO: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}


def memo(key: tuple[Any, ...], keep: tuple[Any, ...], build: Callable[[], T]) -> T:
    """What every rank computes alike from shared objects, once per prediction: `key` names them by id, `keep`
    holds them alive with the entry (so no id is reused while it stands)."""
    hit = _MEMO.get(key)
    if hit is None:
        hit = _MEMO[key] = (keep, build())
    return cast(T, hit[1])


def _shared(kind: str, layout: Any, rank_map: tuple[int, ...], build: Callable[[], T]) -> T:
    key = (kind, layout, id(rank_map))
    hit = _SHARED.get(key)
    if hit is not None and hit[0] is rank_map:
        return cast(T, hit[1])
    if len(_SHARED) >= _SHARED_LIMIT:
        _SHARED.clear()
    value = build()
    _SHARED[key] = (rank_map, value)
    return value


def rank_array(rank_map: tuple[int, ...]) -> RankArray:
    """A rank map as an array (once per map)."""
    def build() -> RankArray:
        if rank_map is identity_map(len(rank_map)):
            return np.arange(len(rank_map), dtype=np.int64)
        return np.fromiter(rank_map, dtype=np.int64, count=len(rank_map))

    return _shared("array", (), rank_map, build)


class Geometry:
    """Every replica of a layout over a rank map, and where each rank sits in them, shared by every rank.

    table[i] holds replica i's ranks in row-major order of the layout; a rank's first cell is first[rank]
    (-1: in none) and count[rank] how many cells hold it (more than one: a rank named twice in a layout).
    """

    def __init__(self, layout: Layout, rank_map: tuple[int, ...]):
        self.layout, self.rank_map = layout, rank_map
        ranks = rank_array(rank_map)
        bases = replica_bases(collapse(layout), len(rank_map))
        self.table: RankArray = ranks[bases[:, None] + cell_array(layout)[None, :]]
        self.cells = self.table.shape[1]
        self._first: RankArray | None = None
        self._count: np.ndarray[Any, np.dtype[np.int32]] | None = None

    @property
    def replicas(self) -> int:
        return int(self.table.shape[0])

    def _index(self) -> None:
        flat = self.table.ravel()
        extent = int(flat.max()) + 1 if flat.size and flat.max() >= 0 else 1
        inside = flat[flat >= 0]
        self._count = np.bincount(inside, minlength=extent).astype(np.int32)
        first = np.full(extent, -1, dtype=np.int64)
        cells = np.flatnonzero(flat >= 0)
        if inside.size and self._count.max() > 1:  # a rank named twice: its first cell
            inside, at = np.unique(inside, return_index=True)
            cells = cells[at]
        first[inside] = cells
        self._first = first

    def count(self, rank: int) -> int:
        """How many cells hold `rank`."""
        if self._count is None:
            self._index()
        assert self._count is not None
        return int(self._count[rank]) if 0 <= rank < self._count.size else 0

    def counts(self, world: int) -> np.ndarray[Any, np.dtype[np.int32]]:
        """count() of every rank of the world."""
        if self._count is None:
            self._index()
        assert self._count is not None
        out = np.zeros(world, dtype=np.int32)
        n = min(world, self._count.size)
        out[:n] = self._count[:n]
        return out

    def first_cells(self, world: int) -> RankArray:
        """Every rank's first cell in the table (flat index), -1 where none."""
        if self._first is None:
            self._index()
        assert self._first is not None
        out = np.full(world, -1, dtype=np.int64)
        n = min(world, self._first.size)
        out[:n] = self._first[:n]
        return out

    def spots(self, rank: int) -> list[tuple[int, int]]:
        """rank -> [(replica index, flat index within it)], every cell that holds it."""
        n = self.count(rank)
        if n == 0:
            return []
        if n == 1:
            assert self._first is not None
            return [divmod(int(self._first[rank]), self.cells)]
        return [divmod(int(i), self.cells) for i in np.flatnonzero(self.table.ravel() == rank)]

    def row(self, replica: int) -> tuple[int, ...]:
        return tuple(self.table[replica].tolist())


def geometry(layout: Layout, rank_map: tuple[int, ...]) -> Geometry:
    """Geometry(layout, rank_map), once per pair (LayoutError if the layout does not tile the rank map)."""
    return _shared("geometry", layout, rank_map, lambda: Geometry(layout, rank_map))


def shared_replicas(layout: Layout, rank_map: tuple[int, ...]) -> list[tuple[int, ...]]:
    """replicas(), computed once per (layout, rank map)."""
    return _shared("replicas", layout, rank_map, lambda: replicas(layout, rank_map))


def shared_flat_ranks(layout: Layout, rank_map: tuple[int, ...]) -> tuple[int, ...]:
    """Every replica's ranks, one after another: the mesh tensor DeviceMesh builds groups from, flattened."""
    return _shared("flat", layout, rank_map, lambda: tuple(geometry(layout, rank_map).table.ravel().tolist()))


def shared_dim_groups(dim: Dim, rank_map: tuple[int, ...]) -> list[tuple[int, ...]]:
    return shared_replicas((dim,), rank_map)


def shared_view(layout: Layout, rank_map: tuple[int, ...], replica: int) -> Any:
    """One replica as nested lists (a Grid), the same object for every rank that sees it."""
    def build() -> Any:
        geo = geometry(layout, rank_map)
        nested: Any = geo.table[replica].reshape(sizes_of(layout) or ()).tolist()
        return Grid(nested) if isinstance(nested, list) else nested

    return _shared(f"view{replica}", layout, rank_map, build)


@lru_cache(maxsize=64)
def identity_map(n: int) -> tuple[int, ...]:
    """init_device_mesh's rank map, one object per size (see _shared)."""
    return tuple(range(n))


_INTERNED: dict[tuple[int, ...], tuple[int, ...]] = {}
_PLAN_MAPS: dict[int, tuple[int, ...]] = {}  # id -> rank map (kept alive here, so the id stays its own)


def interned(ranks: tuple[int, ...]) -> tuple[int, ...]:
    """One object for every equal rank map (see _shared, which keys by identity): a rank map a plan names."""
    if len(_INTERNED) > 1024:
        _INTERNED.clear()
    kept = _INTERNED.setdefault(ranks, ranks)
    named_by_plan(kept)
    return kept


def named_by_plan(rank_map: tuple[int, ...]) -> None:
    """The plan names this rank map (an explicit layout, one submesh of a list picked by its index)."""
    _PLAN_MAPS[id(rank_map)] = rank_map


def is_plan_map(rank_map: tuple[int, ...]) -> bool:
    """Whether a rank map is one the plan names (init_device_mesh's ranks, an explicit layout, a submesh picked
    by its index), the same object on every rank, rather than one a rank made from what it sees (a group's
    ranks, its view of a mesh): what a rank's place in it is tells ranks apart."""
    return rank_map is identity_map(len(rank_map)) or _PLAN_MAPS.get(id(rank_map)) is rank_map


class DimInfo:
    """The groups along one dim of a rank map, as DeviceMesh creates them (one per replica of the dim, in mesh
    order), shared by every rank: a group's ranks are made into tuples only for the groups a rank asks about."""

    def __init__(self, dim: Dim, rank_map: tuple[int, ...], world: int):
        self.geometry = geometry((dim,), rank_map)
        table = self.geometry.table
        self.count = self.geometry.replicas
        self.size = self.geometry.cells
        self.spans_world = self.size == world
        ordered = np.sort(table, axis=1)
        self.ascending = np.all(np.diff(table, axis=1) > 0, axis=1) if self.size > 1 else np.ones(self.count, bool)
        # where mesh order and group-rank order agree: position by position (a group's source or destination
        # may sit where they do), and rank by rank (a rank's local rank is the same either way)
        self._agree: np.ndarray[Any, np.dtype[np.bool_]] | None = None
        self._sorted = ordered
        self._tuples: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        # (index, message): the first group new_group refuses, where every rank raises
        bad = np.any(np.diff(ordered, axis=1) == 0, axis=1) if self.size > 1 else np.zeros(self.count, bool)
        bad |= (ordered[:, 0] < 0) | (ordered[:, -1] >= world) | (self.size > world)
        found = np.flatnonzero(bad)
        self.first_invalid: tuple[int, str] | None = None
        if found.size:
            index = int(found[0])
            why = group_refusal(self.ranks(index), world)
            assert why is not None
            self.first_invalid = (index, why)

    def _pair(self, index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        pair = self._tuples.get(index)
        if pair is None:
            pair = self._tuples[index] = (tuple(self._sorted[index].tolist()),
                                          tuple(self.geometry.table[index].tolist()))
        return pair

    def ranks(self, index: int) -> tuple[int, ...]:
        """Group `index`'s ranks in torch's group-rank order (sorted)."""
        return self._pair(index)[0]

    def order(self, index: int) -> tuple[int, ...]:
        """Group `index`'s ranks in mesh order."""
        return self._pair(index)[1]

    def agreement(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Per group and position: whether mesh order and group-rank (sorted) order put the same rank there."""
        if self._agree is None:
            self._agree = self.geometry.table == self._sorted
        return self._agree

    def group_of(self, world: int) -> RankArray:
        """Every rank's (first) group index along the dim, -1 where it is in none."""
        geo = self.geometry
        geo.count(0)  # indexes the table
        assert geo._first is not None
        out = np.full(world, -1, dtype=np.int64)
        n = min(world, geo._first.size)
        first = geo._first[:n]
        out[:n] = np.where(first >= 0, first // max(1, self.size), -1)
        return out

    def member_of(self, rank: int) -> list[int]:
        """Indexes of the groups that hold `rank` (several: a rank named twice)."""
        return sorted({rep for rep, _ in self.geometry.spots(rank)})


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
