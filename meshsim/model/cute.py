"""torch's layout algebra (_FlatLayout and _MeshLayout, torch/distributed/_mesh_layout.py, CuTe-inspired), as the
model states it with its own index algebra (meshsim.model.layout): what DeviceMesh's bookkeeping of ranks rests
on, asked directly.

A layout is nested sizes with strides (default row-major); flattened and coalesced it is one canonical list of
(size, stride) modes. Positions are enumerated lexicographically (torch's convention, not CuTe's colexicographic
one). Composition follows CuTe's walk (torch raises AssertionError where a stride does not walk the layout
evenly).
"""

from __future__ import annotations

import math
from typing import Any

from . import layout as L
from .expect import Err, ModelRaise


def _flat(value: Any) -> list[int]:
    return [value] if isinstance(value, int) else [x for v in value for x in _flat(v)]


def _same_structure(a: Any, b: Any) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int)
    return len(a) == len(b) and all(_same_structure(x, y) for x, y in zip(a, b))


def flat_layout(sizes: Any, strides: Any = None) -> L.Dim:
    """_FlatLayout(sizes, strides): the canonical modes (nested dims flattened, size-1 dims dropped, neighbours
    that continue each other merged); ValueError where sizes and strides differ in structure."""
    flat_sizes = _flat(sizes)
    if strides is None:
        flat_strides = [math.prod(flat_sizes[i + 1:]) for i in range(len(flat_sizes))]
    elif not _same_structure(sizes, strides):
        raise ModelRaise(Err("ValueError", "don't match"))
    else:
        flat_strides = _flat(strides)
    return L.canonical(tuple(zip(flat_sizes, flat_strides)))


def mesh_layout(sizes: list[int], strides: list[int] | None = None) -> L.Layout:
    """_MeshLayout.from_sizes_strides: one single-mode axis per size."""
    if strides is None:
        strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    if len(sizes) != len(strides):
        raise ModelRaise(Err("ValueError", "sizes and strides must have the same length"))
    return tuple(L.canonical(((s, d),)) for s, d in zip(sizes, strides))


def modes_seen(dim: L.Dim) -> list[list[int]]:
    """What torch lists as sizes_and_strides: each mode as [size, stride]."""
    return [[s, d] for s, d in dim]


def complement(dim: L.Dim, world: int) -> L.Dim:
    """The layout of the offsets that repeat `dim` until `world` positions are covered: the gaps between its modes
    (by stride, innermost first; a mode that does not reach past the ones inside it is refused with
    AssertionError), then as many repeats of the whole as the world needs (rounded up)."""
    modes = []
    current = 1
    for stride, size in sorted((d, s) for s, d in dim):
        if stride == 0 or size == 1:
            continue
        if current > size * stride:
            raise ModelRaise(Err("AssertionError", ""))
        modes.append((stride // current, current))
        current = size * stride
    modes.append((-(-world // current), current))
    return L.canonical(tuple(reversed(modes)))


def global_ranks(dim: L.Dim, world: int) -> list[list[int]]:
    """Every group `dim` makes in a world of `world` ranks (the offsets from the complement, first)."""
    return [[base + p for p in L.positions(dim)] for base in L.positions(complement(dim, world))]


def check_sorted(dim: L.Dim) -> bool:
    strides = [d for _, d in dim]
    return strides == sorted(strides, reverse=True)


def composition(left: L.Dim, right: L.Layout) -> list[L.Dim]:
    """left ∘ right, one result per axis of right: the positions left takes at the indices right enumerates."""
    return [_compose(left, axis) for axis in right]


def _compose(left: L.Dim, axis: L.Dim) -> L.Dim:
    """CuTe's composition of one mode (size:stride): walking left's modes from the innermost (all but the
    outermost), first skip `stride` positions (the remaining stride and each mode's size must divide one another,
    else torch raises AssertionError), then keep `size` of what is left; the outermost mode takes the rest. Where
    the sizes do not divide, the walk keeps fewer than `size` positions, as torch's does."""
    if not axis:
        return ()
    if len(axis) > 1:
        raise ModelRaise(Err(None, ""))  # from_sizes_strides makes single-mode axes
    rest_size, rest_stride = axis[0]
    if rest_stride == 0 or not left:  # every index lands on position 0
        return L.canonical(((rest_size, 0),))
    modes = []
    for size, stride in reversed(left[1:]):
        if size % rest_stride and rest_stride % size:
            raise ModelRaise(Err("AssertionError", ""))
        kept = min(max(1, size // rest_stride), rest_size)
        if kept != 1:
            modes.append((kept, rest_stride * stride))
        rest_size //= kept
        rest_stride = -(-rest_stride // size)
    if rest_size != 1 or not modes:
        modes.append((rest_size, rest_stride * left[0][1]))
    return L.canonical(tuple(reversed(modes)))


def remap(layout: L.Layout, rank_map: tuple[int, ...]) -> Any:
    """remap_to_tensor: the ranks of every replica of the layout over `rank_map`, nested by the axes' sizes."""
    try:
        replicas = L.replicas(layout, rank_map)
    except L.LayoutError as exc:
        raise ModelRaise(Err(None, "")) from exc
    sizes = tuple(L.size_of(axis) for axis in layout)
    return [L.nest(list(replica), sizes) if sizes else replica[0] for replica in replicas]
