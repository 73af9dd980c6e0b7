"""DTensor placements as the plan language writes them: torch's own str() of Shard, Replicate and Partial."""

from __future__ import annotations

import math
import re
from typing import Any

REDUCE_OPS = ("sum", "avg", "max", "min")
MAX_DTENSOR_NUMEL = 4096  # a global tensor stays this small: the model copies it once per rank
MAX_DTENSOR_DIMS = 4

# ("S", dim), ("R",) or ("P", reduce op): a placement as the model and the plan language hold it
Placement = tuple[Any, ...]

_PLACEMENT = re.compile(r"S\((-?\d{1,2})\)|R|P\((" + "|".join(REDUCE_OPS) + r")\)")


def parse_placement(text: str) -> Placement:
    """"S(d)" -> ("S", d), "R" -> ("R",), "P(op)" -> ("P", op)."""
    match = _PLACEMENT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"placement {text!r} is not S(dim), R or P(sum|avg|max|min)")
    if text == "R":
        return ("R",)
    return ("S", int(match.group(1))) if match.group(1) is not None else ("P", match.group(2))


def placement_text(p: Placement) -> str:
    return "R" if p[0] == "R" else f"S({p[1]})" if p[0] == "S" else f"P({p[1]})"


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """A row-major tensor's strides."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
