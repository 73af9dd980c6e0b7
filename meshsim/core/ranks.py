"""Ranks in words, one way everywhere: [0, 1, 2, 3, 5] is "0-3,5"."""

from __future__ import annotations

from collections.abc import Iterable


def ranks_text(ranks: Iterable[int]) -> str:
    """[0,1,2,3,5] -> '0-3,5'."""
    ordered = sorted(set(ranks))
    parts, start = [], None
    for i, r in enumerate(ordered):
        if start is None:
            start = r
        if i + 1 == len(ordered) or ordered[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)


SPELLED_OUT = 64  # a group of more ranks is shown by its first ranks, its last and its size


def group_text(ranks: Iterable[int]) -> str:
    """A group's ranks in order, as a list; a large group (a world of a million ranks) by its ends and size."""
    shown = list(ranks)
    if len(shown) <= SPELLED_OUT:
        return str(shown)
    return f"[{', '.join(map(str, shown[:8]))}, ..., {shown[-1]}] ({len(shown):,} ranks)"
