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
