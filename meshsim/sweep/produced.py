"""What a sweep produced and then checked, not what it drew: derived meshes by kind, and redistribute transforms by
cell (where on the mesh, from which placement, to which) with the conditions they ran under.

A derived mesh counts when its step made it on some rank and a later step used it there without an error (a
check, a query, a collective, a DTensor step, or deriving again). A transform counts when a redistribute (or
full_tensor) step returned on some rank, and the move is one torch's plan makes on a mesh dim of size > 1: the
step's observation is itself the check. Only runs that agree with the model count.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..core.wire import SKIPPED, is_error
from ..spec.placements import parse_placement

MESH_KINDS = {"slice": "slice", "flatten": "flatten", "unflatten": "unflatten", "concatenate": "concatenate",
              "from_group": "from_group", "all_submeshes": "submeshes"}
SOURCES = ("R", "S", "P(sum)", "P(avg)", "P(max)", "P(min)")
TARGETS = ("R", "S")
POSITIONS = ("1-D", "outer", "inner")  # a 1-D mesh's dim; the first of several; a later one
CONDITIONS = ("even", "uneven", "nested shards", "size-1 mesh dim", "several Partials", "Partial sum with avg",
              "on a derived mesh", "flattened root", "derived after")


def cells() -> list[tuple[str, str, str]]:
    """Every (position, source, target) a user's redistribute can make torch perform: to Partial only where it
    already is (no move), and Replicate -> Replicate is none either."""
    return [(pos, src, dst) for pos in POSITIONS for src in SOURCES for dst in TARGETS if (src, dst) != ("R", "R")]


@dataclass
class Produced:
    meshes: Counter = field(default_factory=Counter)  # kind -> meshes produced and then checked
    cells: Counter = field(default_factory=Counter)  # (position, source, target) -> moves produced and checked
    conditions: Counter = field(default_factory=Counter)  # condition -> redistribute steps that ran under it

    def add(self, plan: Any, record: Any) -> None:
        """Count one run that agreed with the model."""
        seen = _Seen(plan, record)
        for index, st in enumerate(plan.steps):
            kind = MESH_KINDS.get(st.op)
            if kind is not None and st.out and seen.made(index) and seen.used_later(st.out, index):
                self.meshes[kind] += 1
            if st.op in ("redistribute", "full_tensor") and seen.made(index):
                self._transforms(seen, index, st)

    def _transforms(self, seen: _Seen, index: int, st: Any) -> None:
        from ..model.dtensor import greedy_transforms

        source = seen.dtensor(st.args["tensor"], index)
        mesh_shape = seen.mesh_shape_of_dtensor(st.args["tensor"], index)
        if source is None or mesh_shape is None:
            return
        src = [parse_placement(p) for p in source["placements"]]
        dst = [parse_placement(p) for p in st.args["placements"]] if st.op == "redistribute" else [("R",)] * len(src)
        dst = [("S", p[1] + len(source["shape"])) if p[0] == "S" and p[1] < 0 else p for p in dst]
        moves = [(d, c, t) for d, c, t in greedy_transforms(src, dst, mesh_shape) if mesh_shape[d] > 1]
        for d, current, target in moves:
            position = "1-D" if len(mesh_shape) == 1 else "outer" if d == 0 else "inner"
            self.cells[(position, _kind(current), _kind(target))] += 1
        if moves:
            for condition in _conditions(seen, st, index, source["shape"], src, dst, mesh_shape):
                self.conditions[condition] += 1

    def missing(self) -> dict[str, list[Any]]:
        """What a sweep never produced and checked: mesh kinds, transform cells and conditions."""
        return {"meshes": [k for k in dict.fromkeys(MESH_KINDS.values()) if not self.meshes[k]],
                "cells": [c for c in cells() if not self.cells[c]],
                "conditions": [c for c in CONDITIONS if not self.conditions[c]]}

    def to_json(self) -> dict[str, Any]:
        return {"meshes": {k: self.meshes[k] for k in dict.fromkeys(MESH_KINDS.values())},
                "cells": {" ".join(c): self.cells[c] for c in cells()},
                "conditions": {c: self.conditions[c] for c in CONDITIONS},
                "missing": {k: [" ".join(c) if isinstance(c, tuple) else c for c in v]
                            for k, v in self.missing().items()}}


def _kind(p: tuple) -> str:
    return "S" if p[0] == "S" else "R" if p[0] == "R" else f"P({p[1]})"


def _conditions(seen: _Seen, st: Any, index: int, shape: list[int], src: list[tuple], dst: list[tuple],
                mesh_shape: tuple[int, ...]) -> list[str]:
    out = []
    uneven = False
    for placements in (src, dst):
        for dim in {p[1] for p in placements if p[0] == "S"}:
            split = [mesh_shape[i] for i, p in enumerate(placements) if p == ("S", dim)]
            uneven = uneven or shape[dim] % math.prod(split) != 0
            if len(split) > 1:
                out.append("nested shards")
    out.append("uneven" if uneven else "even")
    if 1 in mesh_shape:
        out.append("size-1 mesh dim")
    partials = [p[1] for p in src if p[0] == "P"]
    if len(partials) > 1:
        out.append("several Partials")
    if {"sum", "avg"} <= set(partials):
        out.append("Partial sum with avg")
    mesh = seen.mesh_of_dtensor(st.args["tensor"], index)
    if mesh is not None and seen.derived(mesh):
        out.append("on a derived mesh")
    root = seen.root_of(mesh) if mesh is not None else None
    if root is not None and seen.flattened_before(root, index):
        out.append("flattened root")
    if root is not None and seen.derived_after(root, index):
        out.append("derived after")
    return list(dict.fromkeys(out))


class _Seen:
    """A plan with what its ranks observed: which handle each step made, which succeeded, what they held."""

    def __init__(self, plan: Any, record: Any):
        self.plan = plan
        self.observations = [s.observations or [] for s in record.states]
        self.makers: dict[str, list[int]] = {}  # handle -> the steps that made it
        for index, st in enumerate(plan.steps):
            if st.out:
                self.makers.setdefault(st.out, []).append(index)

    def values(self, index: int) -> list[Any]:
        return [obs[index] for obs in self.observations if index < len(obs) and obs[index] != SKIPPED]

    def made(self, index: int) -> bool:
        return any(not is_error(v) for v in self.values(index))

    def made_by(self, handle: str, before: int) -> int | None:
        name = handle.partition(".")[0]
        steps = [i for i in self.makers.get(name, []) if i < before]
        return steps[-1] if steps else None

    def used_later(self, handle: str, index: int) -> bool:
        for later in range(index + 1, len(self.plan.steps)):
            st = self.plan.steps[later]
            if self.made_by(handle, later) != index:
                return False  # the handle was made again
            if any(_names(value, handle) for value in st.args.values()) and self.made(later):
                return True
        return False

    def first_value(self, index: int) -> Any:
        return next((v for v in self.values(index) if not is_error(v)), None)

    def dtensor(self, handle: str, before: int) -> dict | None:
        at = self.made_by(handle, before)
        value = self.first_value(at) if at is not None else None
        return value if isinstance(value, dict) and "placements" in value else None

    def mesh_of_dtensor(self, handle: str, before: int) -> str | None:
        at = self.made_by(handle, before)
        while at is not None:
            args = self.plan.steps[at].args
            if "mesh" in args:
                return str(args["mesh"])
            at = self.made_by(args["tensor"], at) if "tensor" in args else None
        return None

    def mesh_shape_of_dtensor(self, handle: str, before: int) -> tuple[int, ...] | None:
        mesh = self.mesh_of_dtensor(handle, before)
        at = self.made_by(mesh, before) if mesh is not None else None
        value = self.first_value(at) if at is not None else None
        if isinstance(value, list) and mesh is not None and "." in mesh:
            value = value[int(mesh.partition(".")[2])]
        return tuple(value["shape"]) if isinstance(value, dict) and "shape" in value else None

    def derived(self, mesh: str) -> bool:
        at = self.made_by(mesh, len(self.plan.steps))
        return at is not None and self.plan.steps[at].op in MESH_KINDS

    def root_of(self, mesh: str | None) -> str | None:
        seen: set[str] = set()
        while mesh is not None and mesh not in seen:
            seen.add(mesh)
            at = self.made_by(mesh, len(self.plan.steps))
            if at is None:
                return None
            st = self.plan.steps[at]
            if st.op not in MESH_KINDS and st.op != "root_mesh":
                return mesh
            source = st.args.get("src") or (st.args.get("srcs") or [None])[0]
            if source is None:
                return mesh
            mesh = str(source)
        return mesh

    def flattened_before(self, root: str, index: int) -> bool:
        return any(st.op == "flatten" and self.made(i) and self.root_of(str(st.args["src"])) == root
                   for i, st in enumerate(self.plan.steps[:index]))

    def derived_after(self, root: str, index: int) -> bool:
        return any(st.op in ("flatten", "unflatten", "slice") and self.made(i) and
                   self.root_of(str(st.args["src"])) == root
                   for i, st in enumerate(self.plan.steps) if i > index)


def _names(value: Any, handle: str) -> bool:
    """Whether a step argument refers to `handle` (or one of its list items)."""
    if isinstance(value, str):
        return value == handle or value.partition(".")[0] == handle
    if isinstance(value, list):
        return any(_names(v, handle) for v in value)
    return False
