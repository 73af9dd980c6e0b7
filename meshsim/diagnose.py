"""Why a run did not finish: who waits where, for whom, and who is to blame.

Built from the live progress events every rank sent before each blocking call, so ranks stuck inside C++
are located too. Works for plans and for users' own functions alike (the plan, when there is one, only
adds mesh coordinates and breaks ties between culprits).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .model import torch_side

KINDS = {
    "dead": "dead rank",
    "raised": "exception on a rank",
    "straggler": "straggler past the deadline",
    "inconsistent": "inconsistent mesh across ranks",
    "subset": "group creation on a subset of ranks",
    "reordered": "reordered collectives",
    "skipped": "skipped collective",
    "unknown": "ranks waiting, cause unclear",
}


@dataclass
class Wait:
    rank: int
    step: int | None
    op: str | None  # the plan step's op (or "function")
    call: str  # the collective, or new_group
    group_ranks: list[int]
    group_name: str
    mesh: str | None
    mesh_dim: Any
    group_coordinate: list | None
    missing: list[int]

    def to_json(self) -> dict:
        return {"rank": self.rank, "step": self.step, "op": self.op, "call": self.call,
                "group_ranks": self.group_ranks, "group": self.group_name, "mesh": self.mesh,
                "mesh_dim": self.mesh_dim, "group_coordinate": self.group_coordinate, "missing": self.missing}


@dataclass
class Diagnosis:
    kind: str
    culprits: list[int]
    summary: str
    waits: list[Wait] = field(default_factory=list)
    elsewhere: dict[int, str] = field(default_factory=dict)  # where the ranks that are not waiting are
    stacks: list[tuple[list[int], str]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"kind": self.kind, "culprit_ranks": self.culprits, "summary": self.summary,
                "waiting": [w.to_json() for w in self.waits],
                "elsewhere": {str(r): where for r, where in sorted(self.elsewhere.items())},
                "stacks": [{"ranks": ranks, "stack": text} for ranks, text in self.stacks]}


def diagnose(record: Any, plan: Any = None, prediction: Any = None) -> Diagnosis:
    states = record.states
    waits = [_wait(s, states, plan, prediction) for s in states if s.end == "stuck" and s.call is not None]
    waiting = {w.rank for w in waits}
    elsewhere = {s.rank: s.where for s in states if s.rank not in waiting}
    kind, culprits = _classify(record, waits, plan)
    diagnosis = Diagnosis(KINDS[kind], culprits, "", waits, elsewhere, _group_stacks(record.stacks))
    diagnosis.summary = _summary(diagnosis, states)
    return diagnosis


def _matches(call: tuple | None, other: tuple | None) -> bool:
    """Whether `other` is the same blocking call as `call` (same group, same position on it)."""
    if call is None or other is None:
        return False
    if call[1] == "new_group":
        return other[1] == "new_group" and other[3] == call[3] and other[2] == call[2]
    return other[1] == call[1] and other[3] == call[3] and other[4] == call[4]


def _wait(state: Any, states: list, plan: Any, prediction: Any) -> Wait:
    _, kind, ranks, group, seq, ctx = state.call
    missing = [m for m in ranks if not (states[m].end == "stuck" and _matches(state.call, states[m].call))]
    mesh, dim = (ctx or (None, None))[:2]
    learned = ctx[2] if ctx is not None and len(ctx) > 2 else None
    if kind == "new_group" and isinstance(dim, str) and dim.startswith("mesh_"):
        dim = dim[len("mesh_"):]
        dim = int(dim[4:]) if re.fullmatch(r"dim_\d+", dim) else dim
    coordinate = learned or _group_coordinate(state, plan, prediction, mesh, dim)
    return Wait(state.rank, state.step, state.op, kind, list(ranks), group, mesh, dim, coordinate, missing)


def _group_coordinate(state: Any, plan: Any, prediction: Any, handle: str | None, dim: Any) -> list | None:
    """The group's place in its mesh: this rank's coordinate with the group's dim as '*'."""
    if plan is None or prediction is None or handle is None or dim is None or state.step is None:
        return None
    for index in range(min(state.step, len(plan.steps) - 1), -1, -1):
        if plan.steps[index].out == handle:
            summary = torch_side(prediction.expected(state.rank, index))
            if not isinstance(summary, dict) or summary.get("coordinate") is None:
                return None
            coordinate: list = list(summary["coordinate"])
            names = summary.get("names") or []
            position = names.index(dim) if isinstance(dim, str) and dim in names else dim
            if isinstance(position, int) and -len(coordinate) <= position < len(coordinate):
                coordinate[position] = "*"
                return coordinate
            return None
    return None


def _classify(record: Any, waits: list[Wait], plan: Any) -> tuple[str, list[int]]:
    states = record.states
    if record.died:
        return "dead", record.died
    if record.raised:
        return "raised", record.raised
    stragglers = [s.rank for s in states if s.end == "stuck" and s.call is None]
    if stragglers and (not waits or any(m in stragglers for w in waits for m in w.missing)):
        return "straggler", stragglers
    if not waits:
        return "unknown", []
    if waits[0].call == "new_group" or any(w.call == "new_group" for w in waits):
        return _classify_creation(states, waits)
    return _classify_collectives(states, waits, plan)


def _classify_creation(states: list, waits: list[Wait]) -> tuple[str, list[int]]:
    creating = [w for w in waits if w.call == "new_group"]
    # Do ranks disagree about what group a name stands for? (different meshes, or rank maps that differ)
    for w in creating:
        camps: dict[tuple[int, ...], list[int]] = {}
        for s in states:
            ranks = s.created.get(w.group_name)
            if ranks is not None:
                camps.setdefault(ranks, []).append(s.rank)
        if len(camps) > 1:
            sizes = sorted(len(c) for c in camps.values())
            smallest = [r for c in camps.values() if len(c) == sizes[0] for r in c]
            return "inconsistent", sorted(smallest) if sizes[0] < sizes[-1] else sorted(r for c in camps.values() for r in c)
    # The same group under another name: some ranks created groups that others skipped, so the group
    # counters drifted. Those that skipped (fewer creations) are at fault.
    counts = {s.rank: s.groups_created for s in states}
    involved = {m for w in creating for m in w.group_ranks}
    top = max(counts[r] for r in involved)
    behind = sorted(r for r in involved if counts[r] < top)
    return "subset", behind or sorted({m for w in creating for m in w.missing})


def _minority(states: list, waits: list[Wait], others: list[int]) -> list[int]:
    """Of two camps that disagree, the smaller one (ties: the camp that others wait for)."""
    waiting = sorted({w.rank for w in waits} - set(others))
    camp = sorted(set(others))
    return camp if len(camp) <= len(waiting) or not waiting else waiting


def _classify_collectives(states: list, waits: list[Wait], plan: Any) -> tuple[str, list[int]]:
    waiting = {w.rank for w in waits}
    cycle = [w for w in waits if any(m in waiting and states[m].call[3] != w.group_name for m in w.missing)]
    if cycle:
        # Members wait on each other in different groups: calls made in a different order.
        camps = Counter(w.group_name for w in cycle)
        (first, _), = camps.most_common(1)
        minority = sorted(w.rank for w in cycle if w.group_name != first)
        divergent = _plan_divergent(plan, len(states)) & {w.rank for w in cycle} if plan is not None else set()
        return "reordered", sorted(divergent) or minority
    culprits: set[int] = set()
    for w in waits:
        culprits |= _first_divergence(states, w)
    return "skipped", sorted(culprits) or sorted({m for w in waits for m in w.missing})


def _first_divergence(states: list, wait: Wait) -> set[int]:
    """On the waited-for group, the members whose calls part from the majority's first.

    A rank that skipped a collective makes its next call on that group from a later step (or never),
    so at the first position where members disagree it is the odd one out.
    """
    members = wait.group_ranks
    depth = max(states[m].calls_on.get(wait.group_name, 0) for m in members)
    for seq in range(depth):
        seen = {m: states[m].call_log.get((wait.group_name, seq)) for m in members}
        camps = Counter(seen.values())
        if len(camps) > 1:
            (majority, _), = camps.most_common(1)
            return {m for m, v in seen.items() if v != majority}
    return set()


def _plan_divergent(plan: Any, world: int) -> set[int]:
    ranks: set[int] = set()
    for st in plan.steps:
        if st.diverges:
            ranks |= st.divergent_ranks(world)
    return ranks


def _group_stacks(stacks: dict[int, str]) -> list[tuple[list[int], str]]:
    groups: dict[str, list[int]] = {}
    for rank, text in sorted(stacks.items()):
        key = _normalise_stack(text)
        if key:
            groups.setdefault(key, []).append(rank)
    return [(ranks, text) for text, ranks in groups.items()]


def _normalise_stack(text: str) -> str:
    """The thread that matters, most recent call first, without meshsim's own plumbing below the plan."""
    blocks = re.split(r"\n\s*\n", text.strip())
    kept = []
    for block in blocks:
        if "meshsim/worker/main.py" in block and " in watch" in block:
            continue  # the lifeline watcher thread
        lines = []
        for line in block.splitlines():
            if "meshsim/worker/main.py" in line or "multiprocessing/" in line:
                break  # below here: the worker's command loop and process bootstrap
            if "meshsim/worker/progress.py" in line or "c10d_logger.py" in line:
                continue  # the instrumentation wrapper
            lines.append(line.rstrip())
        kept.append("\n".join(lines))
    text = "\n\n".join(k for k in kept if k.strip())
    return re.sub(r"0x[0-9a-f]+", "0x…", text)


def _summary(d: Diagnosis, states: list) -> str:
    who = ", ".join(map(str, d.culprits)) or "none identified"
    if not d.waits:
        return f"{d.kind}: culprit ranks {who}"
    w = d.waits[0]
    where = f" (mesh {w.mesh!r}, dim {w.mesh_dim!r}" + (f", coordinate {w.group_coordinate})" if w.group_coordinate else ")") \
        if w.mesh is not None else ""
    missing = ", ".join(f"{m} {states[m].where}" for m in w.missing[:4]) or "nobody"
    more = f" (and {len(d.waits) - 1} more waiting ranks)" if len(d.waits) > 1 else ""
    at = "in the user function" if w.op == "function" else f"at step {w.step} ({w.op})"
    return (f"{d.kind}: rank {w.rank} waits in {w.call} on group {w.group_ranks}{where} {at}"
            f"{more}; missing: {missing}. Culprit ranks: {who}.")
