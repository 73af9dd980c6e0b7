"""Rank classes: the ranks of a world that the model answers alike, so a million ranks cost a few ranks' runs.

The model tier predicts a world by class (meshsim.model.predict.predict(..., by_class=True)). Two ranks share a class
when every question the model asks about a rank gets the same answer for both:
- the plan's own divergence: whether each step runs on the rank, and which per-rank overrides it gets;
- for every mesh over a rank map the plan names (init_device_mesh's ranks, an explicit layout): how many cells
  hold the rank; along every dim of it, whether the rank's group is in ascending rank order and comes before the
  first group torch refuses; for every new_group, whether the rank is a member;
- for the hang simulation, which classes share each of the rank's groups (the group's composition).
Classes start from the plan and split until no question tells two members apart; a split adds representatives,
whose runs may touch new structures, and so on to a fixed point. Each class's representative (its smallest
rank) runs through the per-rank model; the other members' observations differ from it only in values (their
coordinate, their group's ranks), not in what they raise, which findings they meet, or which calls they make.

Two more members of every class (its largest rank and a seeded one) run too, as a check: their runs must have the
representative's shape (how each step ended, the findings and where, the calls by kind and group kind). A
mismatch means a question this module does not ask; the prediction then falls back to every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..spec.plan import Plan
from . import layout as L
from .dtensor import DTensorModel, local_shapes
from .expect import Err, Quirk
from .mesh import WORLD_KEY, Call

T = TypeVar("T")
Labels = np.ndarray[Any, np.dtype[np.int64]]

MAX_CLASSES = 2048  # more classes than this and the plan is not symmetric enough to pay: every rank runs


class Unclassable(Exception):
    """The plan splits the world into too many classes, or a sampled member does not match its class."""


@dataclass
class RankClasses:
    """Which class every rank of the world is in (label), and each class's representative (its smallest rank)."""

    label: Labels
    reps: list[int]

    @property
    def world(self) -> int:
        return int(self.label.size)

    def __len__(self) -> int:
        return len(self.reps)

    def of(self, rank: int) -> int:
        return int(self.label[rank])

    def sizes(self) -> list[int]:
        return [int(n) for n in np.bincount(self.label, minlength=len(self.reps))]

    def members(self, cls: int) -> list[int]:
        return [int(r) for r in np.flatnonzero(self.label == cls)]

    def expand(self, ranks: Sequence[int] | set[int]) -> list[int]:
        """Every rank of the classes these ranks are in."""
        classes = sorted({int(self.label[r]) for r in ranks if 0 <= r < self.world})
        if not classes:
            return []
        return [int(r) for r in np.flatnonzero(np.isin(self.label, classes))]


class ClassView(Sequence[T]):
    """Per-rank access to what each class holds: view[rank] is the item of the rank's class, len() is the world,
    and iterating gives each class's item once (in class order: the representatives). With `exact`, a rank that
    is not its class's representative gets its own item, made by exact(rank) when asked for (the model's own
    prediction of that rank, values and all), so asking about one rank of a million costs one rank's run."""

    def __init__(self, classes: RankClasses, items: list[T], exact: Callable[[int], T] | None = None):
        self.classes, self.items, self.exact = classes, items, exact
        self._own: dict[int, T] = {}

    def __len__(self) -> int:
        return self.classes.world

    def __getitem__(self, rank: Any) -> Any:
        if isinstance(rank, slice):
            raise TypeError("a ClassView is indexed by rank")
        cls = int(self.classes.label[rank])
        if self.exact is None or self.classes.reps[cls] == rank:
            return self.items[cls]
        if rank not in self._own:
            if len(self._own) >= 64:
                self._own.clear()
            self._own[rank] = self.exact(rank)
        return self._own[rank]

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)


# --------------------------------------------------------------------------------------------- finding classes


def refine(label: Labels, feature: np.ndarray[Any, Any]) -> Labels:
    """Split every class by a per-rank feature (classes are renumbered; a class's smallest rank stays its rep)."""
    if feature.size == 0 or feature.min() == feature.max():
        return label
    codes = feature.astype(np.int64) - int(feature.min())
    span = int(codes.max()) + 1
    if span > label.size:  # sparse codes: make them dense first
        _, codes = np.unique(codes, return_inverse=True)
        span = int(codes.max()) + 1
    return _numbered(label * span + codes.ravel())


def _numbered(key: Labels) -> Labels:
    """Class ids 0..n-1 for distinct keys, numbered by each class's smallest rank (so its representative, the
    smallest rank, stays first). A lookup table where the keys are few (no sort of a million ranks). Keys may be
    negative: a group's composition is a sum of 62-bit tags that wraps around."""
    top = int(key.max()) + 1
    if int(key.min()) >= 0 and top <= 4 * key.size:
        present = np.zeros(top, dtype=np.int64)
        present[key] = 1
        dense = (np.cumsum(present) - 1)[key]
    else:
        _, dense = np.unique(key, return_inverse=True)
        dense = dense.ravel()
    first = np.full(int(dense.max()) + 1, key.size, dtype=np.int64)
    np.minimum.at(first, dense, np.arange(key.size, dtype=np.int64))
    renumber = np.empty(first.size, dtype=np.int64)
    renumber[np.argsort(first)] = np.arange(first.size)
    out: Labels = renumber[dense]
    return out


def representatives(label: Labels) -> list[int]:
    """Each class's smallest rank, in class order."""
    first = np.full(int(label.max()) + 1, label.size, dtype=np.int64)
    np.minimum.at(first, label, np.arange(label.size, dtype=np.int64))
    return [int(r) for r in first]


def _valid(ranks: Any, world: int) -> list[int]:
    return [r for r in ranks if isinstance(r, int) and 0 <= r < world]


def divergence_label(plan: Plan, world: int) -> Labels:
    """Classes from the plan alone: ranks a step skips, runs only on, or overrides fields of are told apart."""
    label: Labels = np.zeros(world, dtype=np.int64)
    for st in plan.steps:
        if not st.diverges:
            continue
        feature = np.zeros(world, dtype=np.int64)
        if st.only_on is not None:
            feature[_valid(st.only_on, world)] = 1
        feature[_valid(st.skip_on, world)] |= 2
        codes: dict[str, int] = {}
        for rank, over in st.on_rank.items():
            if rank in _valid([rank], world):
                feature[rank] += 4 * codes.setdefault(repr(sorted(over.items(), key=str)), len(codes) + 1)
        label = refine(label, feature)
    return label


def structure_feature(obj: Any, world: int) -> np.ndarray[Any, Any] | None:
    """What a structure the model touched tells about every rank (None: nothing the model reads)."""
    if isinstance(obj, tuple):  # a new_group's members
        feature = np.zeros(world, dtype=np.int8)
        feature[_valid(obj, world)] = 1
        return feature
    if isinstance(obj, L.Geometry):
        if not L.is_plan_map(obj.rank_map):
            return None  # a map made from another (a group, a rank's view): its geometry follows from that one
        counts: np.ndarray = np.minimum(obj.counts(world), 2)
        return counts
    if isinstance(obj, DTensorModel):
        return _dtensor_feature(obj, world)
    if isinstance(obj, L.DimInfo):
        if not L.is_plan_map(obj.geometry.rank_map):
            return None
        group = obj.group_of(world)
        bad = obj.first_invalid[0] if obj.first_invalid is not None else obj.count
        agree = obj.agreement()
        pattern = _row_kinds(agree)  # which positions agree, group by group
        cells = obj.geometry.first_cells(world)
        inside = group >= 0
        feature = np.zeros(world, dtype=np.int64)
        mine = agree.ravel()[cells[inside]]  # the rank's own position
        feature[inside] = 1 + mine + 2 * (group[inside] < bad) + 4 * pattern.ravel()[group[inside]]
        return feature
    return None


def _row_kinds(rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """An id per row of a table, equal rows alike (all rows alike: no sort at all)."""
    if rows.size == 0 or bool((rows == rows[:1]).all()):
        return np.zeros(rows.shape[0], dtype=np.int64)
    packed = np.ascontiguousarray(np.packbits(rows, axis=1) if rows.dtype == np.bool_ else rows)
    flat = packed.view(np.dtype((np.void, packed.dtype.itemsize * packed.shape[1]))).ravel()
    _, kinds = np.unique(flat, return_inverse=True)
    out: np.ndarray[Any, Any] = kinds.ravel()
    return out


def _dtensor_feature(dt: DTensorModel, world: int) -> np.ndarray[Any, Any]:
    """Where values are simulated, every cell of the mesh holds other values: a class each. Where they are not (a
    mesh of more than MAX_DTENSOR_RANKS), ranks with the same local shape run a DTensor step alike."""
    cells = L.geometry(dt.mesh.layout, dt.mesh.rank_map).first_cells(world)
    if dt.simulated:
        return cells
    shape = tuple(dt.mesh.shape)
    inside = cells >= 0
    coords = np.stack(np.unravel_index(cells[inside] % max(1, int(np.prod(shape))), shape), axis=1)
    shapes = local_shapes(dt.shape, dt.placements, shape, coords)
    feature = np.zeros(world, dtype=np.int64)
    feature[inside] = 1 + (_row_kinds(shapes) if shapes.size else 0)
    return feature


def composition_feature(info: L.DimInfo, label: Labels) -> np.ndarray[Any, Any] | None:
    """Which classes share each rank's group along a dim (a class split by it no longer mixes compositions)."""
    if not L.is_plan_map(info.geometry.rank_map) or int(label.max()) == 0:
        return None
    world = label.size
    table = info.geometry.table
    inside = (table >= 0) & (table < world)
    labs = np.where(inside, label[np.clip(table, 0, world - 1)], -1) + 1
    labs.sort(axis=1)
    if (labs == labs[:1]).all():
        return None  # every group holds the same classes
    # a group's set of classes, as the sum of a random 63-bit number per class present (repeats counted once)
    tags = np.random.default_rng(0).integers(1, 1 << 62, size=int(labs.max()) + 1, dtype=np.int64)
    picked = tags[labs]
    picked[:, 1:][labs[:, 1:] == labs[:, :-1]] = 0
    comp = _numbered(picked.sum(axis=1))
    group = info.group_of(world)
    feature = np.full(world, -1, dtype=np.int64)
    feature[group >= 0] = comp[group[group >= 0]]
    return feature


class Classifier:
    """Classes of a world for a plan, refined to a fixed point (see the module's docstring); `run(rank)` is
    meshsim.model.predict's RankRun of a rank."""

    def __init__(self, plan: Plan, world: int, run: Any):
        self.world, self.run = world, run
        self.label = divergence_label(plan, world)
        self.runs: dict[int, Any] = {}
        self.applied: set[int] = set()
        self.dims: list[L.DimInfo] = []

    def settle(self, compositions: bool) -> RankClasses:
        """Refine until no question tells members of a class apart; with `compositions`, also until every group of
        a kind that holds a class holds the same classes (what an exact simulation of blocking calls needs)."""
        while True:
            reps = representatives(self.label)
            if len(reps) > MAX_CLASSES:
                raise Unclassable(f"the plan splits {self.world:,} ranks into more than {MAX_CLASSES} classes")
            for rank in reps:
                if rank not in self.runs:
                    self.runs[rank] = self.run(rank)
            fresh = self._apply_structures(reps)
            if compositions:
                for info in self.dims:
                    feature = composition_feature(info, self.label)
                    if feature is not None:
                        self.label = refine(self.label, feature)
            if not fresh and int(self.label.max()) + 1 == len(reps):
                return RankClasses(self.label, reps)

    def _apply_structures(self, reps: list[int]) -> bool:
        fresh = False
        for rank in reps:
            for obj in list(self.runs[rank].model.touched.values()):
                if id(obj) in self.applied:
                    continue
                self.applied.add(id(obj))
                fresh = True
                if isinstance(obj, L.DimInfo):
                    self.dims.append(obj)
                feature = structure_feature(obj, self.world)
                if feature is not None:
                    self.label = refine(self.label, feature)
        return fresh

    def runs_of(self, classes: RankClasses) -> dict[int, Any]:
        return {rank: self.runs[rank] for rank in classes.reps}


def lockstep(classes: RankClasses, runs: dict[int, Any]) -> bool:
    """Whether no blocking call can wait forever, whichever groups the members of a class are in: every class
    whose ranks are in the groups of a kind makes the same calls there (same ops, same sizes, the same positions),
    and the classes' orders of calls agree with one order of them all (no two classes make two calls in opposite
    orders). Then the world runs as one SPMD program: the classes need no splitting by what their groups hold."""
    label, everyone = classes.label, set(range(len(classes)))
    sequences: dict[Any, dict[int, list[tuple[Any, ...]]]] = {}  # kind -> class -> its calls there
    holding: dict[Any, set[int]] = {}  # kind -> the classes with ranks in its groups
    after: dict[Any, set[Any]] = {}
    for cls, rep in enumerate(classes.reps):
        model, previous = runs[rep].model, None
        for call in runs[rep].prediction.calls:
            kind = _kind_of(model, call)
            if kind is None:
                return False  # a group of a map only some ranks see: no one kind to compare by
            if kind not in holding:
                holding[kind] = _holding(model, kind, label, everyone)
            entry = abstract_call(model, call)
            sequences.setdefault(kind, {}).setdefault(cls, []).append(entry)
            if previous is not None:
                after.setdefault(previous, set()).add(entry)
            previous = entry
    for kind, made in sequences.items():
        if set(made) != holding[kind] or len({tuple(calls) for calls in made.values()}) > 1:
            return False  # some ranks of its groups make other calls there, or none
    return _acyclic(after)


def _kind_of(model: Any, call: Call) -> Any:
    """The kind of a call's group: the world, a dim of a mesh the plan names, or a new_group of the plan's own
    (None: a group of a map only some ranks see)."""
    group = call.key if call.kind == "create" else call.key[:-1]
    if group == WORLD_KEY:
        return WORLD_KEY
    kind = model.kinds.get(group)
    if kind is not None:
        return kind
    if len(group) == 2 and isinstance(group[1], tuple) and id(group[1]) not in model.dim_groups:
        return group
    return None


def _holding(model: Any, kind: Any, label: Labels, everyone: set[int]) -> set[int]:
    """The classes whose ranks are in the groups of a kind."""
    if kind == WORLD_KEY or len(everyone) == 1:
        return everyone
    ranks = model.kind_dims[kind].geometry.table if kind in model.kind_dims else \
        np.asarray(kind[1], dtype=np.int64)
    inside = ranks[(ranks >= 0) & (ranks < label.size)]
    return {int(c) for c in np.unique(label[inside])}


def _acyclic(after: dict[Any, set[Any]]) -> bool:
    """Whether the 'made after' relation between calls has no cycle (Kahn's algorithm)."""
    nodes = set(after) | {n for targets in after.values() for n in targets}
    incoming = {n: 0 for n in nodes}
    for targets in after.values():
        for n in targets:
            incoming[n] += 1
    ready = [n for n, count in incoming.items() if count == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for n in after.get(node, ()):
            incoming[n] -= 1
            if incoming[n] == 0:
                ready.append(n)
    return seen == len(nodes)


# --------------------------------------------------------------------------------------------- the check


def sample_members(classes: RankClasses, seed: int = 0) -> list[int]:
    """Two more members of every class of more than one rank: its largest, and a seeded one."""
    label, world = classes.label, classes.world
    last = np.zeros(len(classes), dtype=np.int64)
    np.maximum.at(last, label, np.arange(world, dtype=np.int64))
    shuffled = np.random.default_rng(seed).permutation(world)
    _, first = np.unique(label[shuffled], return_index=True)
    picked = {int(r) for r in last} | {int(shuffled[i]) for i in first}
    return sorted(picked - set(classes.reps))


def shape_of(run: Any) -> tuple[Any, ...]:
    """A rank's run without its values: how it ended, what each step raised and which findings it met where,
    and its calls by kind, group kind and position."""
    pred, model = run.prediction, run.model
    seen: dict[int, Any] = {}
    return (pred.end, pred.end_step, frozenset(model.findings), tuple(_skeleton(o, seen) for o in pred.observations),
            tuple(abstract_call(model, call) for call in pred.calls))


def _skeleton(value: Any, seen: dict[int, Any]) -> Any:
    if isinstance(value, Quirk):
        return ("quirk", value.finding, _skeleton(value.right, seen), _skeleton(value.torch, seen))
    if isinstance(value, Err):
        return ("error", value.type)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _skeleton(v, seen)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        if id(value) in seen:
            return seen[id(value)]
        leaf: Any = value
        while isinstance(leaf, (list, tuple)) and leaf:
            leaf = leaf[0]
        numbers = leaf == [] or leaf == () or (isinstance(leaf, (int, float)) and not isinstance(leaf, bool))
        shape = ("numbers",) if numbers else ("list", frozenset(_skeleton(v, seen) for v in value))
        seen[id(value)] = shape
        return shape
    return type(value).__name__


def abstract_call(model: Any, call: Call) -> tuple[Any, ...]:
    """A call named by its group's kind (every group of one mesh dim is one kind) and its position there."""
    if call.kind == "create":
        kind = model.kinds.get(call.key)
        return ("create", kind if kind is not None else call.key, call.step)
    group, seq = call.key[:-1], call.key[-1]
    kind = model.kinds.get(group)
    return (call.kind, kind if kind is not None else (WORLD_KEY if group == WORLD_KEY else group), seq, call.detail,
            call.step)


def check_classes(classes: RankClasses, runs: dict[int, Any], run: Any) -> None:
    """Raises Unclassable when a sampled member's run differs in shape from its representative's."""
    shapes = {rank: shape_of(r) for rank, r in runs.items()}
    for rank in sample_members(classes):
        rep = classes.reps[classes.of(rank)]
        if shape_of(run(rank)) != shapes[rep]:
            raise Unclassable(f"rank {rank} does not run like rank {rep}, its class's representative")


def one_class(world: int) -> RankClasses:
    return RankClasses(np.zeros(world, dtype=np.int64), [0])


# --------------------------------------------------------------------------------------------- blocking calls


@dataclass(frozen=True)
class ClassCall(Call):
    """A blocking call of a whole class: members are the classes its group holds, weight how many of the group's
    ranks are of this class (the majority of a group counts ranks, not classes)."""

    weight: int = 1
    concrete: Call | None = None  # the representative's own call


def class_calls(classes: RankClasses, runs: dict[int, Any]) -> list[list[Call]]:
    """Every class's blocking calls, for meshsim.model.predict.simulate played by classes: a class arrives at a
    call when its members do, and a call's members are the classes its group holds. Exact, because every group of a kind
    that holds a class holds the same classes (Classifier.settle(compositions=True) splits them until it does)."""
    label, world = classes.label, classes.world
    everyone = tuple(range(len(classes)))
    cache: dict[Any, tuple[tuple[int, ...], dict[int, int]]] = {}

    def composition(members: tuple[int, ...]) -> tuple[tuple[int, ...], dict[int, int]]:
        key = (id(members), len(members))
        if key not in cache:
            if len(members) == world and members[0] == 0 and members[-1] == world - 1:
                counts = np.bincount(label, minlength=len(classes))
            else:
                counts = np.bincount(label[np.asarray(members, dtype=np.int64)], minlength=len(classes))
            present = tuple(int(c) for c in np.flatnonzero(counts))
            cache[key] = (everyone if len(present) == len(classes) else present,
                          {c: int(counts[c]) for c in present})
        return cache[key]

    out = []
    for cls, rep in enumerate(classes.reps):
        model, calls = runs[rep].model, list[Call]()
        for call in runs[rep].prediction.calls:
            group = call.key if call.kind == "create" else call.key[:-1]
            kind = model.kinds.get(group, group)
            members, counts = composition(call.members)
            key = ("create", kind, members) if call.kind == "create" else (kind, members, call.key[-1])
            calls.append(ClassCall(call.kind, key, members, call.step, call.detail, call.context, counts[cls], call))
        out.append(calls)
    return out


def concrete(call: Call) -> Call:
    """A class's call as its representative made it."""
    return call.concrete if isinstance(call, ClassCall) and call.concrete is not None else call


def ranks_missing(classes: RankClasses, call: Call, missing: tuple[int, ...]) -> tuple[int, ...]:
    """The ranks of a call's group (the representative's own) whose classes are missing from it."""
    group = np.asarray(call.members, dtype=np.int64)
    return tuple(int(m) for m in group[np.isin(classes.label[group], list(missing))])
