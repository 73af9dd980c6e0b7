"""The blocks of a DTensor, emulated in pure Python: a tensor as its shape, its values in row-major order and its
strides (where torch leaves a view), and what DTensor does to one locally: torch.chunk's chunks, padding and
unpadding, cat, the reductions of a collective (meshsim.model.dtensor moves blocks across the mesh).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..spec.placements import contiguous_strides
from .expect import Err, ModelRaise


class SizeMismatch(Exception):
    """Members of one collective pass blocks of different sizes: `sent` is each member's block, `dims` the mesh
    dims of the collective."""

    def __init__(self, dims: tuple[int, ...], sent: dict[int, tuple[int, ...]]):
        super().__init__(f"members of a collective on mesh dims {list(dims)} pass different sizes: {sent}")
        self.dims, self.sent = dims, sent


class GatherWrongSize(Exception):
    """A gather whose unpadded result is not the logical size (members' blocks add up to another size than the
    global shape they were given): torch from 2.12 refuses it after the collective, on every member."""

    def __init__(self, dims: tuple[int, ...], longer: bool):
        super().__init__(f"the gather on mesh dims {list(dims)} is {'longer' if longer else 'shorter'} than its "
                         "logical size")
        self.dims, self.longer = dims, longer


@dataclass(frozen=True)
class Block:
    """A tensor: its shape, its values in row-major order, and its strides where it is a non-contiguous view
    (torch's narrow leaves one; None: contiguous)."""

    shape: tuple[int, ...]
    values: tuple[float, ...]
    strides: tuple[int, ...] | None = None

    @property
    def contiguous(self) -> bool:
        return self.strides is None

    def split3(self, dim: int) -> tuple[int, int, int]:
        return math.prod(self.shape[:dim]), self.shape[dim], math.prod(self.shape[dim + 1:])


Blocks = dict[int, "Block"]  # rank -> its block


def arange_block(shape: tuple[int, ...], base: float = 0.0) -> Block:
    """Values that tell every element apart: base + its row-major index."""
    return Block(tuple(shape), tuple(base + i for i in range(math.prod(shape))))


def empty_block() -> Block:
    return Block((0,), ())


def is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """torch's is_contiguous: an empty tensor is; size-1 dims' strides do not count."""
    if math.prod(shape) == 0:
        return True
    return all(size == 1 or st == want for size, st, want in zip(shape, strides, contiguous_strides(shape)))


def narrow(b: Block, dim: int, start: int, length: int) -> Block:
    """A view (torch.narrow): the strides stay those of the tensor it narrows."""
    if length == b.shape[dim]:
        return b
    outer, size, inner = b.split3(dim)
    out: list[float] = []
    for o in range(outer):
        base = (o * size + start) * inner
        out.extend(b.values[base:base + length * inner])
    shape = b.shape[:dim] + (length,) + b.shape[dim + 1:]
    strides = b.strides or contiguous_strides(b.shape)
    return Block(shape, tuple(out), None if is_contiguous(shape, strides) else strides)


def made_contiguous(b: Block) -> Block:
    return Block(b.shape, b.values) if b.strides is not None else b


def select_chunk(b: Block, dim: int, k: int, index: int) -> Block:
    """Shard._select_split_tensor(clone=True): a chunk, cloned (a clone of a view with gaps is contiguous)."""
    start, length = chunk_bounds(b.shape[dim], k)[index]
    return made_contiguous(narrow(b, dim, start, length))


def cat(blocks: list[Block], dim: int) -> Block:
    first = blocks[0]
    outer = math.prod(first.shape[:dim])
    inner = math.prod(first.shape[dim + 1:])
    if any(b.shape[:dim] != first.shape[:dim] or b.shape[dim + 1:] != first.shape[dim + 1:] for b in blocks):
        raise ModelRaise(Err("RuntimeError", "Sizes of tensors must match"))
    out: list[float] = []
    for o in range(outer):
        for b in blocks:
            n = b.shape[dim] * inner
            out.extend(b.values[o * n:(o + 1) * n])
    return Block(first.shape[:dim] + (sum(b.shape[dim] for b in blocks),) + first.shape[dim + 1:], tuple(out))


def pad(b: Block, dim: int, n: int) -> Block:
    """Zeros appended along dim (torch's pad_tensor); a negative pad cuts the end off, as F.pad does (a block
    longer than the full chunk of the global shape from_local was given)."""
    if n < 0:
        return made_contiguous(narrow(b, dim, 0, max(0, b.shape[dim] + n)))
    if n == 0:
        return b
    outer, _, inner = b.split3(dim)
    return cat([b, Block(b.shape[:dim] + (n,) + b.shape[dim + 1:], (0.0,) * (outer * n * inner))], dim)


def chunk_bounds(size: int, k: int) -> list[tuple[int, int]]:
    """torch.chunk's (start, length) of each of k chunks, trailing chunks empty (DTensor fills them in)."""
    full = -(-size // k) if size else 0
    return [(min(i * full, size), max(0, min(size, i * full + full) - min(i * full, size))) for i in range(k)]


def full_chunk(size: int, k: int) -> int:
    return -(-size // k)


def split_padded(b: Block, dim: int, k: int) -> tuple[list[Block], list[int]]:
    """Shard._split_tensor(with_padding=True): the chunks, each zero-padded to the full chunk size."""
    full = full_chunk(b.shape[dim], k)
    chunks, pads = [], []
    for start, length in chunk_bounds(b.shape[dim], k):
        pads.append(full - length)
        chunks.append(pad(narrow(b, dim, start, length), dim, full - length))
    return chunks, pads


def reduce_blocks(blocks: list[Block], op: str) -> Block:
    if len({b.shape for b in blocks}) != 1:
        raise SizeMismatch((), {i: b.shape for i, b in enumerate(blocks)})
    columns = list(zip(*(b.values for b in blocks)))
    if op == "sum":
        values = tuple(math.fsum(c) for c in columns)
    elif op == "avg":
        values = tuple(math.fsum(c) / len(blocks) for c in columns)
    else:
        values = tuple((max if op == "max" else min)(c) for c in columns)
    return Block(blocks[0].shape, values)


def sum_dim(b: Block, dim: int) -> Block:
    """torch.sum over one dim (an empty dim sums to zeros)."""
    outer, size, inner = b.split3(dim)
    values = tuple(math.fsum(b.values[(o * size + i) * inner + j] for i in range(size))
                   for o in range(outer) for j in range(inner))
    return Block(b.shape[:dim] + b.shape[dim + 1:], values)


def scale(b: Block, factor: float) -> Block:
    return Block(b.shape, tuple(v / factor for v in b.values))
