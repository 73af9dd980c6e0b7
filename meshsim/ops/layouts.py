"""torch's layout algebra, the bookkeeping under DeviceMesh (_FlatLayout and _MeshLayout in
torch/distributed/_mesh_layout.py), asked directly: a layout and one question of it, against meshsim.model.cute."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from ..spec import fields as F
from ..spec.plan import step
from .registry import operation, rarely

NEEDS = {"complement": "world", "global_ranks": "world", "composition": "by_sizes", "remap_to_tensor": "ranks"}


def _tuple(value: Any) -> Any:
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


@operation("layout", "query",
           {"sizes": F.LAYOUT_SIZES, "strides": F.LAYOUT_STRIDES, "what": F.LAYOUT_QUERY, "world": F.WORLD,
            "by_sizes": F.LAYOUT_SIZES, "by_strides": F.LAYOUT_STRIDES, "ranks": F.RANK_MAP},
           required=("sizes", "what"), weight=1, needs="flat-layout")
class Layout:
    """torch's layout algebra under DeviceMesh: the _FlatLayout of `sizes` and `strides` (nested; default
    row-major) asked for its canonical sizes_and_strides, all_ranks_from_zero, complement(world),
    global_ranks(world), check_orthogonal, check_sorted, or its composition with the _MeshLayout of
    `by_sizes`/`by_strides` (each axis' sizes_and_strides, and global_ranks(world) when world is given);
    remap_to_tensor(`ranks`) takes sizes/strides as a _MeshLayout's axes"""

    @staticmethod
    def check_args(a: dict) -> None:
        needed = NEEDS.get(a["what"])
        if needed is not None and needed not in a:
            raise F.PlanError(f"layout what={a['what']!r} needs {needed!r}")
        if a["what"] == "remap_to_tensor" and not (isinstance(a["sizes"], list) and all(
                isinstance(s, int) for s in a["sizes"])):
            raise F.PlanError("layout what='remap_to_tensor' takes sizes as a flat list (one per axis)")

    def model(run: Any, a: dict) -> Any:
        from ..model import cute as C

        what = a["what"]
        if what == "remap_to_tensor":
            return C.remap(C.mesh_layout(a["sizes"], a.get("strides")), tuple(a["ranks"]))
        dim = C.flat_layout(a["sizes"], a.get("strides"))
        if what == "sizes_and_strides":
            return C.modes_seen(dim)
        if what == "all_ranks_from_zero":
            from ..model.layout import positions

            return list(positions(dim))
        if what == "complement":
            return C.modes_seen(C.complement(dim, a["world"]))
        if what == "global_ranks":
            return C.global_ranks(dim, a["world"])
        if what == "check_orthogonal":
            from ..model.layout import is_orthogonal

            return is_orthogonal(dim)
        if what == "check_sorted":
            return C.check_sorted(dim)
        right = C.mesh_layout(_as_list(a["by_sizes"]), _as_list(a["by_strides"]) if "by_strides" in a else None)
        return [{"sizes_and_strides": C.modes_seen(axis),
                 **({"global_ranks": C.global_ranks(axis, a["world"])} if "world" in a else {})}
                for axis in C.composition(dim, right)]

    def torch(ex: Any, a: dict) -> Any:
        import torch
        from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout

        what = a["what"]
        strides = _tuple(a["strides"]) if "strides" in a else None
        if what == "remap_to_tensor":
            layout = _MeshLayout.from_sizes_strides(_tuple(a["sizes"]), strides)
            return layout.remap_to_tensor(torch.tensor(a["ranks"], dtype=torch.int)).tolist()
        flat = _FlatLayout(_tuple(a["sizes"]), strides)
        if what in ("sizes_and_strides", "complement"):
            chosen = flat if what == "sizes_and_strides" else flat.complement(a["world"])
            return [list(mode) for mode in chosen.sizes_and_strides]
        if what == "all_ranks_from_zero":
            return flat.all_ranks_from_zero()
        if what == "global_ranks":
            return flat.global_ranks(a["world"])
        if what in ("check_orthogonal", "check_sorted"):
            return bool(getattr(flat, what)())
        right = _MeshLayout.from_sizes_strides(tuple(_as_list(a["by_sizes"])),
                                               tuple(_as_list(a["by_strides"])) if "by_strides" in a else None)
        return [{"sizes_and_strides": [list(m) for m in axis.sizes_and_strides],
                 **({"global_ranks": axis.global_ranks(a["world"])} if "world" in a else {})}
                for axis in flat.composition(right)]

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return draw(layout_steps(b.world, allow_errors))


def _as_list(value: Any) -> list[int]:
    return list(value) if isinstance(value, list) else [value]


ANY_STRIDES = ("sizes_and_strides", "check_orthogonal", "check_sorted")  # questions any layout answers


@st.composite
def layout_steps(draw: Any, world: int, allow_errors: bool = True) -> Any:
    """A layout of a world's ranks (a mesh dim's, or a flattening of several: row-major strides permuted, some
    sizes nested, some of them 1) and one question of it."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 2, 3, 4]), min_size=1, max_size=4))
    numel = math.prod(sizes)
    order = draw(st.permutations(range(len(sizes))))
    strides = [0] * len(sizes)
    running = 1
    for i in reversed(order):  # the dims laid out innermost-first in a drawn order: a permuted row-major layout
        strides[i], running = running, running * sizes[i]
    if allow_errors and rarely(draw, 15):
        strides = strides[:-1] or [1, 1]  # sizes and strides that do not match: refused
    what = draw(st.sampled_from(["sizes_and_strides", "all_ranks_from_zero", "complement", "global_ranks",
                                 "check_orthogonal", "check_sorted", "composition", "remap_to_tensor"]))
    if what in ANY_STRIDES and len(sizes) > 1 and rarely(draw, 3):
        # any strides, overlapping ones too: a permuted row-major layout is always orthogonal and never tells a
        # check that compares the wrong sizes from the right one
        strides = draw(st.lists(st.integers(1, numel), min_size=len(sizes), max_size=len(sizes)))
    args: dict = {"sizes": sizes, "strides": strides, "what": what}
    extent = numel * draw(st.sampled_from([1, 2, 3]))
    if what in ("complement", "global_ranks", "composition"):
        args["world"] = extent
    if what == "composition":
        args["by_sizes"], args["by_strides"] = _selector(draw, numel, allow_errors)
    if what == "remap_to_tensor":
        args["ranks"] = draw(st.permutations(range(extent))) if draw(st.booleans()) else [
            10 * r for r in range(extent)]
    return step("layout", **args)


def _selector(draw: Any, numel: int, allow_errors: bool) -> tuple[list[int], list[int]]:
    """A layout that picks from `numel` positions: a divisor's size, in one axis or split in two, strided by
    divisors (now and then by one that does not walk the layout evenly: refused)."""
    divisors = [n for n in range(1, numel + 1) if numel % n == 0]
    size = draw(st.sampled_from(divisors))
    inner = [p for p in divisors if size % p == 0 and 1 < p < size]
    parts = [size]
    if inner and draw(st.booleans()):
        p = draw(st.sampled_from(inner))
        parts = [size // p, p]
    strides = [draw(st.sampled_from(divisors)) for _ in parts]
    if allow_errors and rarely(draw, 10):
        strides = [s + 1 for s in strides]
    return parts, strides
