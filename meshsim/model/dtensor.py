"""DTensor as the whole mesh holds it, emulated in pure Python.

A DTensor is every mesh member's local block. Each operation is simulated across the mesh twice, once for
each order a dim's group can take:
- *coordinate order* (right): member j of a dim's group is the rank at coordinate j, as DTensor's metadata
  (``compute_local_shape_and_global_offset``, the unpadding, ``Replicate -> Shard``) assumes;
- *group-rank order* (torch): collectives (scatter, all_gather, reduce_scatter, all_to_all, and the source of a
  broadcast) follow the process group's rank order, which is sorted (finding ``group-rank-order``).
On a mesh whose every dim group is sorted, the two agree. Where they differ the rank observes a Quirk
(finding ``dtensor-chunk-by-group-rank``).

The transforms follow torch 2.13's greedy redistribute plan (``generate_greedy_transform_infos``) and its
padding rules: ``torch.chunk`` chunks of ceil(n/k), trailing empty chunks, zero padding to the full chunk size
before a collective, unpadding after it. torch's side also merges consecutive collectives of one kind into one
collective on a flattened mesh that covers their dims (``_optimize_transform_infos``), where the root has one
(finding ``dtensor-merged-collective-on-flattened-mesh``).

Members that pass blocks of different sizes to one collective (from_local inferring different global shapes,
blocks that disagree with the shape they were given) raise SizeMismatch: gloo does not check sizes, so what
torch does there is undefined (finding ``gloo-size-mismatch-silent``).

Its parts: meshsim.model.dtensor_blocks (a block and what DTensor does to one locally) and
meshsim.model.dtensor_plan (a redistribution's moves, torch's greedy plan and its merges); this module moves the
blocks across the mesh and holds the DTensor handles.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ..core.wire import NOT_SIMULATED, local_observation, tensor_values
from ..spec.fields import flatten_layout
from ..spec.placements import (
    MAX_DTENSOR_DIMS,
    MAX_DTENSOR_NUMEL,
    REDUCE_OPS,
    Placement,
    contiguous_strides,
    parse_placement,
    placement_text,
)
from . import layout as L
from .dtensor_blocks import (
    Block,
    Blocks,
    GatherWrongSize,
    SizeMismatch,
    arange_block,
    cat,
    chunk_bounds,
    empty_block,
    full_chunk,
    is_contiguous,
    made_contiguous,
    narrow,
    pad,
    reduce_blocks,
    scale,
    select_chunk,
    split_padded,
    sum_dim,
)
from .dtensor_plan import (
    COMM_KINDS,
    MERGEABLE,
    Move,
    comm_kind,
    greedy_transforms,
    is_shard,
    merged_moves,
    plain_moves,
    unsorted_lookup,
)
from .expect import UNPREDICTED, Err, ModelRaise, Quirk

# What this module re-exports: the placements' vocabulary, the blocks (meshsim.model.dtensor_blocks) and the
# redistribution's plan (meshsim.model.dtensor_plan), so that callers import every part of the DTensor model from here.
__all__ = ["MAX_DTENSOR_DIMS", "MAX_DTENSOR_NUMEL", "REDUCE_OPS", "contiguous_strides", "parse_placement",
           "placement_text",
           "Block", "Blocks", "GatherWrongSize", "SizeMismatch", "arange_block", "cat", "chunk_bounds", "empty_block",
           "full_chunk", "is_contiguous", "made_contiguous", "narrow", "pad", "reduce_blocks", "scale", "select_chunk",
           "split_padded", "sum_dim",
           "COMM_KINDS", "MERGEABLE", "Move", "comm_kind", "greedy_transforms", "is_shard", "merged_moves",
           "plain_moves", "unsorted_lookup"]

T = TypeVar("T")

# Values are simulated for meshes up to the thread tier's largest world: the whole mesh once per step, shared by
# every rank (meshsim.ops.dtensor memoizes it). A larger mesh (the fake and model tiers, to a million ranks) is
# predicted without values: each rank's local shape and global offset follow from its coordinate alone, and the
# collectives each step issues from its placements.
MAX_DTENSOR_RANKS = 1024
FINDING = "dtensor-chunk-by-group-rank"
MERGED = "dtensor-merged-collective-on-flattened-mesh"
CONTRADICTED = "from-group-groups-contradict-mesh"
UNSORTED_LOOKUP = "dtensor-merge-lookup-refuses-unsorted-mesh"
NOT_CONTIGUOUS = "dtensor-local-not-contiguous"
INDEXED_DEVICE = "dtensor-indexed-device-type"  # a mesh of device type "cpu:0": strategies that price a move fail
NOT_CONTIGUOUS = "dtensor-local-not-contiguous"  # torch < 2.10 leaves an unpadded gather a view


# --------------------------------------------------------------------------------------------- observations


def contiguity(block: Block) -> Any:
    """A local tensor should be contiguous (distribute_tensor makes it so); redistribute's unpadding leaves views."""
    return True if block.contiguous else Quirk(True, False, NOT_CONTIGUOUS)


# --------------------------------------------------------------------------------------------- the mesh


class Geometry:
    """Every member's coordinate and every dim group, in both orders, from a mesh's view (nested ranks)."""

    def __init__(self, view: list[Any], shape: tuple[int, ...]):
        self.shape = shape
        self.flat = flat = flatten_layout(view)
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        self.coordinate = {r: tuple((i // s) % n for s, n in zip(strides, shape)) for i, r in enumerate(flat)}
        self.strides = strides

    def line(self, rank: int, dims: int | tuple[int, ...]) -> list[int]:
        """The members of `rank`'s group along `dims` (one mesh dim, or several seen as one flattened dim), in
        coordinate order (row-major over `dims`)."""
        dims = (dims,) if isinstance(dims, int) else dims
        coordinate = self.coordinate[rank]
        base = sum(c * s for c, s in zip(coordinate, self.strides)) - sum(coordinate[d] * self.strides[d]
                                                                          for d in dims)
        positions = [base]
        for d in dims:
            positions = [p + j * self.strides[d] for p in positions for j in range(self.shape[d])]
        return [self.flat[p] for p in positions]

    def scrambled(self, dim: int) -> bool:
        """Whether some group along `dim` has a group-rank order other than its coordinate order."""
        known = self.__dict__.setdefault("_scrambled", {})
        if dim not in known:
            known[dim] = any(self.line(r, dim) != sorted(self.line(r, dim)) for r in self.flat)
        return bool(known[dim])


class Unsimulated:
    """The geometry of a mesh too large to simulate values on: its shape alone."""

    flat: tuple[int, ...] = ()

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape

    def scrambled(self, dim: int) -> bool:
        return False


Order = Callable[[Geometry, int, Any], list[int]]

# The collectives DTensor issues (as torch's CommDebugMode counts them, torch 2.13 on a CPU group): distribute_tensor
# scatters a Shard and broadcasts the rest along every mesh dim; a redistribute issues one per transform on a mesh
# dim of more than one rank (Shard -> Shard gathers too: the CPU group has no all_to_all), none for Replicate ->
# Shard (a local chunk).
TRANSFORM_COMMS = {("S", "R"): "all_gather_into_tensor", ("S", "S"): "all_gather_into_tensor",
                   ("P", "R"): "all_reduce", ("P", "S"): "reduce_scatter_tensor"}


def distribute_comm(p: Placement) -> str:
    return "scatter_" if p[0] == "S" else "broadcast_"


def transform_comm(current: Placement, target: Placement) -> str | None:
    return None if current == target else TRANSFORM_COMMS.get((current[0], target[0]))


def local_shapes(shape: tuple[int, ...], placements: list[Placement], mesh_shape: tuple[int, ...],
                 coordinates: Any) -> Any:
    """local_shape_and_offset's local shapes for many coordinates at once (numpy: an array of coordinates, one row
    each): nested chunking in mesh-dim order, torch.chunk's ceil-sized chunks."""
    import numpy as np

    coords = np.asarray(coordinates, dtype=np.int64).reshape(-1, len(mesh_shape))
    local = np.tile(np.asarray(shape, dtype=np.int64), (coords.shape[0], 1))
    for i, p in enumerate(placements):
        if p[0] != "S":
            continue
        size, k = local[:, p[1]], mesh_shape[i]
        chunk = -(-size // k)  # ceil
        start = np.minimum(coords[:, i] * chunk, size)
        local[:, p[1]] = np.clip(size - start, 0, chunk)
    return local


def coordinate_order(geo: Geometry, rank: int, dims: int | tuple[int, ...]) -> list[int]:
    return geo.line(rank, dims)


def group_rank_order(geo: Geometry, rank: int, dims: int | tuple[int, ...]) -> list[int]:
    """A process group's rank order (new_group sorts), the flattened mesh's group's too."""
    return sorted(geo.line(rank, dims))


@dataclass(frozen=True)
class TorchOrder:
    """The order torch's collectives follow (`order`), and what its release does besides: whether it copies an
    unpadded gather (2.10 on; before, Shard -> Replicate left a non-contiguous view), and whether it narrows a
    gather to the logical size, refusing a shorter one (2.12 on; before, it kept what the gather brought)."""

    order: Callable[[Geometry, int, Any], list[int]]
    copies_unpadded: bool = True
    narrows_to_logical: bool = True

    def __call__(self, geo: Geometry, rank: int, dims: int | tuple[int, ...]) -> list[int]:
        return self.order(geo, rank, dims)


# --------------------------------------------------------------------------------------------- the engine


def normalize(placements: list[Placement], ndim: int) -> list[Placement]:
    return [("S", p[1] + ndim) if p[0] == "S" and p[1] < 0 else p for p in placements]


def check_placements(placements: list[Placement], mesh_ndim: int, tensor_ndim: int | None,
                     mixed_refused: bool = True) -> None:
    """What distribute_tensor / from_local / redistribute refuse before any communication. `mixed_refused`: the
    release refuses Partials of different reduce ops (meshsim.model.semantics: mixed-partials-refused);
    `tensor_ndim` None: the Shard dims go unchecked (a rank outside the mesh shards nothing)."""
    if len(placements) != mesh_ndim:
        raise ModelRaise(Err("ValueError", "`placements` must have the same length as `device_mesh.ndim`"))
    ops = {p[1] for p in placements if p[0] == "P"}
    if mixed_refused and len(ops) > 1 and ops != {"sum", "avg"}:  # sum and avg commute: torch allows that pair
        raise ModelRaise(Err("ValueError", "Mixed Partial reduce types are not supported"))
    for p in placements:
        if p[0] == "S" and tensor_ndim is not None and not 0 <= p[1] < tensor_ndim:
            raise ModelRaise(Err(None, ""))


def logical_shapes(shape: tuple[int, ...], placements: list[Placement], coordinate: tuple[int, ...],
                   mesh_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The tensor's shape as each mesh dim sees it (before that dim's sharding), at this coordinate."""
    out = [tuple(shape)]
    for i, p in enumerate(placements):
        current = list(out[-1])
        if p[0] == "S":
            current[p[1]] = chunk_bounds(current[p[1]], mesh_shape[i])[coordinate[i]][1]
        out.append(tuple(current))
    return out


def local_shape_and_offset(shape: tuple[int, ...], placements: list[Placement], coordinate: tuple[int, ...] | None,
                           mesh_shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """compute_local_shape_and_global_offset: nested chunking in mesh-dim order, by coordinate. An empty shard's
    offset is the global dim's size (torch's convention); a non-member has local shape [0] and no offset."""
    if coordinate is None:
        return [0], []
    local = list(shape)
    indices: dict[int, list[int]] = {}  # tensor dim -> the global indices this rank's shard covers
    for i, p in enumerate(placements):
        if p[0] != "S":
            continue
        d = p[1]
        start, length = chunk_bounds(local[d], mesh_shape[i])[coordinate[i]]
        if length == 0:
            indices[d] = [shape[d]]
        else:
            own = list(range(start, start + length))
            indices[d] = [indices[d][j] for j in own] if d in indices else own
        local[d] = length
    offset = [0] * len(shape)
    for d, index in indices.items():
        offset[d] = index[0]
    return local, offset


def distribute(geo: Geometry, tensors: Mapping[int, Block], placements: list[Placement], order: Order,
               src: int | None = 0) -> dict[int, Block]:
    """distribute_tensor of the tensor each rank passes (`tensors`: rank -> its tensor): per mesh dim in order,
    scatter (Shard) or broadcast from the group's member `src` (its src-th in `order`), unpadding by coordinate.
    With `src` None nothing moves: each rank keeps the chunk at its coordinate of its own tensor."""
    locals_: Mapping[int, Block] = tensors
    for d, p in enumerate(placements):
        new = {}
        for r in geo.flat:
            members = order(geo, r, d)
            if src is None:
                source, index = locals_[r], geo.coordinate[r][d]
            else:
                source, index = locals_[members[src]], members.index(r)
            if p[0] == "S":
                chunks, _ = split_padded(source, p[1], len(members))
                my_pads = [full_chunk(source.shape[p[1]], len(members)) - n
                           for _, n in chunk_bounds(source.shape[p[1]], len(members))]
                got = chunks[index]
                new[r] = made_contiguous(narrow(got, p[1], 0, got.shape[p[1]] - my_pads[geo.coordinate[r][d]]))
            elif p[0] == "P" and p[1] == "sum":
                new[r] = scale(source, len(members))
            else:
                new[r] = source
        locals_ = new
    return dict(locals_)


def redistribute(geo: Geometry, shape: tuple[int, ...], locals_: dict[int, Block], src: list[Placement],
                 dst: list[Placement], order: Order, moves: list[Move] | None = None,
                 beliefs: dict[int, tuple[int, ...]] | None = None) -> dict[int, Block]:
    """DTensor.redistribute's communication, every member at once: `moves` (default: dim by dim, torch's greedy
    plan). `beliefs`: each member's own global shape where members disagree on it (from_local inferred it)."""
    copies = getattr(order, "copies_unpadded", True)  # torch < 2.10 leaves an unpadded gather a view
    narrows = getattr(order, "narrows_to_logical", True)
    for move in moves if moves is not None else plain_moves(src, dst, geo.shape):
        if math.prod(geo.shape[d] for d in move.dims) == 1 or move.current == move.target:
            continue
        at = move.logical_dim if move.logical_dim is not None else move.dims[0]
        logical = {r: logical_shapes((beliefs or {}).get(r, shape), src, geo.coordinate[r], geo.shape)[at]
                   for r in geo.flat}
        memo: dict[Any, Any] = {}  # what members of one group share (their padded blocks), computed once
        locals_ = {r: _transform(locals_, order(geo, r, move.dims), r, geo.line(r, move.dims).index(r), move,
                                 logical, memo, (copies, narrows)) for r in geo.flat}
    return locals_


def sent_shape(block: tuple[int, ...], move: Move, logical: tuple[int, ...], k: int) -> tuple[int, ...]:
    """The size of what a member passes to the move's collective: its block, padded as torch pads it."""
    out, kind = list(block), comm_kind(move)
    if kind == "all_gather" and logical[move.current[1]] % k:
        out[move.current[1]] = full_chunk(logical[move.current[1]], k)
    elif kind == "reduce_scatter" and out[move.target[1]] % k:
        out[move.target[1]] = full_chunk(out[move.target[1]], k) * k
    elif kind == "all_to_all":
        old, new = move.current[1], move.target[1]
        if logical[old] % k:
            out[old] = full_chunk(logical[old], k)
        if logical[new] % k:
            out[new] = full_chunk(logical[new], k) * k
    return tuple(out)


def _transform(locals_: dict[int, Block], members: list[int], r: int, coord: int, move: Move,
               logical: dict[int, tuple[int, ...]], memo: dict[Any, Any] | None = None,
               release: tuple[bool, bool] = (True, True)) -> Block:
    """Rank r's block after one move: `members` in the order the collective follows, `coord` r's index along the
    move's dims in coordinate order, `logical` every member's logical shape; `memo` keeps what the members of
    one group compute alike (one dict per move); `release`: whether an unpadded gather is copied (contiguous),
    and whether a gather is narrowed to the logical size (TorchOrder)."""
    current, target = move.current, move.target
    k, mine, kind = len(members), locals_[r], comm_kind(move)
    memo = {} if memo is None else memo
    group = tuple(members)
    if kind is not None and ("sizes", group) not in memo:
        sent = {m: sent_shape(locals_[m].shape, move, logical[m], k) for m in members}
        if len(set(sent.values())) > 1:
            raise SizeMismatch(move.dims, sent)
        memo[("sizes", group)] = True
    if target[0] == "R" and current[0] == "P":
        if ("reduced", group) not in memo:
            reduced = reduce_blocks([locals_[m] for m in members], current[1])
            memo[("reduced", group)] = scale(reduced, move.avg_scale) if move.avg_scale > 1 else reduced
        return cast(Block, memo[("reduced", group)])
    if target[0] == "R" and current[0] == "S":
        a, size = current[1], logical[r][current[1]]
        if ("gathered", group, size) not in memo:
            memo[("gathered", group, size)] = _gathered([locals_[m] for m in members], move, size, k, release)
        return cast(Block, memo[("gathered", group, size)])
    if target[0] == "S" and current[0] == "R":
        return select_chunk(mine, target[1], k, coord)
    if target[0] == "S" and current[0] == "P":
        a = target[1]
        if ("split", group) not in memo:
            memo[("split", group)] = [split_padded(locals_[m], a, k) for m in members]
        chunks = memo[("split", group)]
        reduced = reduce_blocks([c[0][members.index(r)] for c in chunks], current[1])
        if move.avg_scale > 1:
            reduced = scale(reduced, move.avg_scale)
        pads = chunks[members.index(r)][1]
        if mine.shape[a] % k:
            return narrow(reduced, a, 0, reduced.shape[a] - pads[coord])
        return reduced
    if target[0] == "S" and current[0] == "S":
        return _all_to_all(locals_, members, r, coord, current[1], target[1], logical[r])
    if target[0] == "P" and current[0] == "R":
        return scale(mine, k) if target[1] == "sum" else mine
    if target == ("P", "sum") and current[0] == "S":  # torch >= 2.14: the shard in place, zeros elsewhere
        return _zero_filled(mine, current[1], logical[r][current[1]], k, coord)
    raise ModelRaise(Err("RuntimeError", f"redistribute from {placement_text(current)} to "
                                         f"{placement_text(target)} not supported"))


def _zero_filled(b: Block, dim: int, logical_size: int, k: int, coord: int) -> Block:
    """Shard._to_partial_tensor: the local shard at its offset in a zero tensor of the logical size along dim."""
    start, length = chunk_bounds(logical_size, k)[coord]
    outer, _, inner = b.split3(dim)

    def zeros(n: int) -> Block:
        return Block(b.shape[:dim] + (n,) + b.shape[dim + 1:], (0.0,) * (outer * n * inner))

    return cat([zeros(start), b, zeros(logical_size - start - length)], dim)


def _gathered(blocks: list[Block], move: Move, size: int, k: int, release: tuple[bool, bool]) -> Block:
    """Shard -> Replicate: the members' blocks padded to the full chunk, gathered, and unpadded. Where that leaves
    another size than the logical one (blocks that disagree with the global shape from_local was given), torch
    from 2.12 refuses it; before, it kept what the gather brought."""
    copies, narrows = release
    a = move.current[1]
    gathered = cat([_pad_to(b, a, size, k) for b in blocks], a)
    kept = gathered.shape[a] - (full_chunk(size, k) * k - size if size % k else 0)
    if narrows and kept != size:  # (a longer one: torch's narrow "unexpectedly changed" its size)
        raise GatherWrongSize(move.dims, kept > size)
    out = narrow(gathered, a, 0, size if narrows else max(0, kept))
    return made_contiguous(out) if copies else out


def _pad_to(b: Block, dim: int, logical_size: int, k: int) -> Block:
    if logical_size % k == 0:
        return b
    return pad(b, dim, full_chunk(logical_size, k) - b.shape[dim])


def _all_to_all(locals_: dict[int, Block], members: list[int], r: int, coord: int, old: int, new: int,
                logical: tuple[int, ...]) -> Block:
    k = len(members)

    def padded(b: Block) -> Block:
        if logical[old] % k:
            b = pad(b, old, full_chunk(logical[old], k) - b.shape[old])
        if logical[new] % k:
            b = pad(b, new, full_chunk(logical[new], k) * k - b.shape[new])
        return b

    g = members.index(r)
    pieces = []
    for m in members:
        block = padded(locals_[m])
        step = block.shape[new] // k
        pieces.append(narrow(block, new, g * step, step))
    out = cat(pieces, old)
    if logical[old] % k:
        out = narrow(out, old, 0, logical[old])
    if logical[new] % k:
        length = chunk_bounds(logical[new], k)[coord][1]
        out = narrow(out, new, 0, length)
    return out


# --------------------------------------------------------------------------------------------- DTensor handles


@dataclass
class DTensorModel:
    """A DTensor handle: its mesh, spec, and every member's block as it should be and as torch leaves it
    (torch None: the model does not simulate torch here)."""

    mesh: Any  # MeshModel
    geometry: Geometry | Unsimulated | None  # None on a rank outside the mesh
    shape: tuple[int, ...]
    placements: list[Placement]
    right: dict[int, Block]
    torch: dict[int, Block] | None
    finding: str = FINDING  # what explains torch's blocks where they differ from the right ones
    beliefs: dict[int, tuple[int, ...]] | None = None  # each member's global shape, where members disagree

    def map_sides(self, fn: Callable[[Blocks], Blocks]) -> tuple[Blocks, Blocks | None]:
        """fn of both sides' blocks; torch's stays the very same object as the right one where it was (so a later
        step knows it need not simulate torch apart), and None where it was not simulated."""
        right = fn(self.right)
        return right, right if self.torch is self.right else None if self.torch is None else fn(self.torch)

    def observe(self, rank: int, run: Callable[[dict[int, Block]], Any]) -> Any:
        right = run(self.right)
        if self.torch is None:  # torch's side is not simulated (see meshsim.ops.dtensor._derive)
            return Quirk(right, UNPREDICTED, self.finding)
        torch = run(self.torch)
        return right if right == torch else Quirk(right, torch, self.finding)

    @property
    def simulated(self) -> bool:
        """Whether the blocks (values) are simulated; a mesh of more than MAX_DTENSOR_RANKS is not."""
        return not isinstance(self.geometry, Unsimulated)

    def mesh_shapes(self) -> Any:
        """The distinct local shapes across the mesh (rows), from coordinates near every chunk boundary: enough to
        tell whether the members' shards differ, without a million coordinates."""
        import itertools

        candidates = []
        for k in self.mesh.shape:
            near = {0, 1, k - 2, k - 1}
            for n in set(self.shape):
                for c in (-(-n // k) if k else 0,):
                    if c:
                        near |= {n // c - 1, n // c, n // c + 1}
            candidates.append(sorted(c for c in near if 0 <= c < k))
        coords = list(itertools.product(*candidates))
        import numpy as np

        return np.unique(local_shapes(self.shape, self.placements, tuple(self.mesh.shape), coords), axis=0)

    def observation(self, rank: int) -> Any:
        """What `rank` sees of this DTensor: the spec, its block's shape and values, and its global offset."""
        coordinate = self.mesh.coordinate
        local_shape, offset = local_shape_and_offset(self.shape, self.placements, coordinate, self.mesh.shape)
        texts = [placement_text(p) for p in self.placements]
        if not self.simulated:
            return local_observation(local_shape, NOT_SIMULATED, offset, texts, self.shape)

        def seen(state: dict[int, Block]) -> Any:
            block = state.get(rank, empty_block())
            return local_observation(block.shape, tensor_values(block.values), offset, texts, self.shape)

        return self.observe(rank, seen)


_SIMS: dict[Any, Any] = {}  # one prediction's whole-mesh simulations, shared by the ranks that ask alike
_SIMS_LIMIT = 4096


def shared_sim(key: Any, inputs: tuple[Any, ...], build: Callable[[], T]) -> T:
    """build(), once for every rank of a prediction that asks with the same key and the very same input objects:
    each rank's model simulates the whole mesh, and the members of one mesh would all simulate it alike."""
    hit = _SIMS.get(key)
    if hit is not None and len(hit[0]) == len(inputs) and all(a is b for a, b in zip(hit[0], inputs)):
        return cast(T, hit[1])
    if len(_SIMS) >= _SIMS_LIMIT:
        _SIMS.clear()
    value = build()
    _SIMS[key] = (inputs, value)
    return value


def forget_sims() -> None:
    """Drop the last prediction's simulations (a new plan's blocks are new objects)."""
    _SIMS.clear()


def flattened_layouts(mesh: Any) -> frozenset[Any]:
    """The layouts of the flattened meshes of `mesh`'s root (what torch's merges look up)."""
    return frozenset(flat.layout for flat in mesh.root_mesh.flatten_mapping.values())


def flattened_dims(mesh: Any) -> Callable[[tuple[int, ...]], bool] | None:
    """torch's _get_flattened_mesh_by_layout as a test on mesh dims: whether the root holds a flattened mesh
    whose layout is those dims of `mesh` collapsed into one (None: the root has none, or `mesh` is unnamed)."""
    root = mesh.root_mesh
    if not mesh.names or not root.flatten_mapping:
        return None
    layouts = {flat.layout[0] for flat in root.flatten_mapping.values() if len(flat.layout) == 1}
    return lambda dims: L.collapse(tuple(mesh.layout[d] for d in dims)) in layouts


def refused_lookup(mesh: Any, moves: list[Move]) -> tuple[int, ...] | None:
    """The dims of `mesh` whose flattened-mesh lookup torch's merge pass raises on (dtensor_plan.unsorted_lookup);
    an unnamed mesh is never looked up."""
    if not mesh.names:
        return None
    return unsorted_lookup(moves, lambda dims: L.is_descending(L.collapse(tuple(mesh.layout[d] for d in dims))))


def flattened_mesh(mesh: Any, dims: tuple[int, ...]) -> Any:
    """The flattened mesh of `mesh`'s root that covers `dims` (as flattened_dims found it)."""
    want = L.collapse(tuple(mesh.layout[d] for d in dims))
    return next(flat for flat in mesh.root_mesh.flatten_mapping.values() if flat.layout == (want,))


def contradicted(mesh: Any, geo: Geometry, rank: int) -> bool:
    """Whether this rank's process groups are not the mesh's lines (from_group takes groups and mesh as given)."""
    return any(d < len(mesh.groups) and set(mesh.groups[d].ranks) != set(geo.line(rank, d))
               for d in range(len(geo.shape)))


def geometry_of(mesh: Any) -> Geometry | Unsimulated:
    if mesh.coordinate is None or not isinstance(mesh.view, list):
        raise ModelRaise(Err(None, ""))
    if math.prod(mesh.shape) > MAX_DTENSOR_RANKS:
        return Unsimulated(tuple(mesh.shape))
    return Geometry(mesh.view, tuple(mesh.shape))
