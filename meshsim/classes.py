"""Rank classes: the ranks of a world that the model answers alike, so a million ranks cost a few ranks' runs.

The model tier predicts a world by class (meshsim.predict.predict(..., by_class=True)). Two ranks share a class
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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from .model import layout as L
from .model.expect import Err, Quirk
from .model.mesh import WORLD_KEY, Call
from .spec.plan import Plan

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
    and iterating gives each class's item once (in class order: the representatives)."""

    def __init__(self, classes: RankClasses, items: list[T]):
        self.classes, self.items = classes, items

    def __len__(self) -> int:
        return self.classes.world

    def __getitem__(self, rank: Any) -> Any:
        if isinstance(rank, slice):
            raise TypeError("a ClassView is indexed by rank")
        return self.items[int(self.classes.label[rank])]

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)


# --------------------------------------------------------------------------------------------- finding classes


def refine(label: Labels, feature: np.ndarray[Any, Any]) -> Labels:
    """Split every class by a per-rank feature (classes are renumbered; a class's smallest rank stays its rep)."""
    if feature.size == 0 or feature.min() == feature.max():
        return label
    _, codes = np.unique(feature, return_inverse=True)
    key = label * (int(codes.max()) + 1) + codes
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first)  # number classes by their smallest rank, so class order follows rank order
    renumber = np.empty_like(order)
    renumber[order] = np.arange(order.size)
    out: Labels = renumber[inverse.ravel()].astype(np.int64)
    return out


def representatives(label: Labels) -> list[int]:
    _, first = np.unique(label, return_index=True)
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
        return np.minimum(obj.counts(world), 2)
    if isinstance(obj, L.DimInfo):
        if not L.is_plan_map(obj.geometry.rank_map):
            return None
        group = obj.group_of(world)
        bad = obj.first_invalid[0] if obj.first_invalid is not None else obj.count
        agree = obj.agreement()
        _, pattern = np.unique(agree, axis=0, return_inverse=True)  # which positions agree, group by group
        cells = obj.geometry.first_cells(world)
        inside = group >= 0
        feature = np.zeros(world, dtype=np.int64)
        mine = agree.ravel()[cells[inside]]  # the rank's own position
        feature[inside] = 1 + mine + 2 * (group[inside] < bad) + 4 * pattern.ravel()[group[inside]]
        return feature
    return None


def composition_feature(info: L.DimInfo, label: Labels) -> np.ndarray[Any, Any] | None:
    """Which classes share each rank's group along a dim (a class split by it no longer mixes compositions)."""
    if not L.is_plan_map(info.geometry.rank_map) or int(label.max()) == 0:
        return None
    world = label.size
    table = info.geometry.table
    inside = (table >= 0) & (table < world)
    labs = np.where(inside, label[np.clip(table, 0, world - 1)], -2)
    labs.sort(axis=1)
    if (labs == labs[:1]).all():
        return None  # every group holds the same classes
    repeat = np.zeros(labs.shape, dtype=bool)
    repeat[:, 1:] = labs[:, 1:] == labs[:, :-1]
    labs[repeat] = -1
    labs.sort(axis=1)
    _, comp = np.unique(labs, axis=0, return_inverse=True)
    comp = comp.ravel()
    group = info.group_of(world)
    feature = np.full(world, -1, dtype=np.int64)
    feature[group >= 0] = comp[group[group >= 0]]
    return feature


def find_classes(plan: Plan, world: int, run: Any) -> tuple[RankClasses, dict[int, Any]]:
    """The classes of the world for this plan, and each representative's run (`run(rank)`: meshsim.predict's
    RankRun of that rank). Raises Unclassable when the world splits into more than MAX_CLASSES."""
    label = divergence_label(plan, world)
    runs: dict[int, Any] = {}
    applied: set[int] = set()
    dims: list[L.DimInfo] = []
    while True:
        reps = representatives(label)
        if len(reps) > MAX_CLASSES:
            raise Unclassable(f"the plan splits {world:,} ranks into more than {MAX_CLASSES} classes")
        for rank in reps:
            if rank not in runs:
                runs[rank] = run(rank)
        before, fresh = len(reps), False
        for rank in reps:
            for obj in list(runs[rank].model.touched.values()):
                if id(obj) in applied:
                    continue
                applied.add(id(obj))
                fresh = True
                if isinstance(obj, L.DimInfo):
                    dims.append(obj)
                feature = structure_feature(obj, world)
                if feature is not None:
                    label = refine(label, feature)
        for info in dims:
            feature = composition_feature(info, label)
            if feature is not None:
                label = refine(label, feature)
        if not fresh and int(label.max()) + 1 == before:
            return RankClasses(label, reps), {r: runs[r] for r in reps}


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


def simulate_classes(classes: RankClasses, runs: dict[int, Any]) -> tuple[list[Any], list[tuple[Call, tuple[int, ...]]]]:
    """meshsim.predict.simulate played by classes: a class arrives at a call when its members do. Exact, because
    every group of a kind that holds a class holds the same classes (find_classes splits them until it does).
    Returns the stuck representatives (in their own calls, missing the ranks of their group not in that call)
    and mismatched calls with the ranks that passed other sizes."""
    from .predict import RankPrediction, Stuck, simulate

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

    preds = []
    for cls, rep in enumerate(classes.reps):
        model, calls = runs[rep].model, []
        for call in runs[rep].prediction.calls:
            group = call.key if call.kind == "create" else call.key[:-1]
            kind = model.kinds.get(group, group)
            members, counts = composition(call.members)
            key = ("create", kind, members) if call.kind == "create" else (kind, members, call.key[-1])
            calls.append(ClassCall(call.kind, key, members, call.step, call.detail, call.context, counts[cls], call))
        preds.append(RankPrediction(cls, calls=calls))
    stuck, mismatched = simulate(preds)
    out = []
    for held in stuck:
        rep = classes.reps[held.rank]
        concrete = held.call.concrete if isinstance(held.call, ClassCall) else None
        assert concrete is not None
        members = np.asarray(concrete.members, dtype=np.int64)
        gone = members[np.isin(label[members], list(held.missing))]
        out.append(Stuck(rep, concrete, tuple(int(m) for m in gone)))
    lifted = []
    for call, odd in mismatched:
        concrete = call.concrete if isinstance(call, ClassCall) else call
        assert concrete is not None
        lifted.append((concrete, tuple(m for m in concrete.members if classes.of(m) in odd)))
    return out, lifted
