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

from ..model import torch_side
from ..outcome import blame
from ..predict import divergent_ranks
from ..wire import DIED, RAISED, STUCK

KINDS = {
    "dead": "dead rank",
    "raised": "exception on a rank",
    "straggler": "straggler past the deadline",
    "inconsistent": "inconsistent mesh across ranks",
    "subset": "group creation on a subset of ranks",
    "reordered": "reordered collectives",
    "skipped": "skipped collective",
    "size": "tensor sizes differ across ranks",
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
    waits = [_wait(s, states, plan, prediction) for s in states if s.end == STUCK and s.call is not None]
    waiting = {w.rank for w in waits}
    elsewhere = {s.rank: s.where + _last_words(s) for s in states if s.rank not in waiting}
    kind, culprits, note = _classify(record, waits, plan, prediction)
    diagnosis = Diagnosis(KINDS[kind], culprits, "", waits, elsewhere, _group_stacks(record.stacks))
    diagnosis.summary = _summary(diagnosis, states) + (f" {note}" if note else "")
    return diagnosis


def _matches(call: Any, other: Any) -> bool:
    """Whether `other` is the same blocking call as `call` (same group, same position on it)."""
    if call is None or other is None:
        return False
    if call.kind == "new_group":
        return other.kind == "new_group" and other.group == call.group and other.ranks == call.ranks
    return other.kind == call.kind and other.group == call.group and other.seq == call.seq


def _wait(state: Any, states: list, plan: Any, prediction: Any) -> Wait:
    kind, ranks, group, seq, ctx = state.call
    missing = [m for m in ranks if not (states[m].end == STUCK and _matches(state.call, states[m].call))]
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


def _classify(record: Any, waits: list[Wait], plan: Any, prediction: Any) -> tuple[str, list[int], str]:
    """The kind of failure, its culprits (meshsim.outcome.blame) and a note on what the ranks disagree about."""
    states = record.states
    stragglers = [s.rank for s in states if s.end == STUCK and s.call is None]
    late = stragglers and (not waits or any(m in stragglers for w in waits for m in w.missing))
    evidence: list[int] = []
    note = ""
    if record.died:
        kind = "dead"
    elif record.raised:
        kind = "raised"
    elif late:
        kind = "straggler"
    elif not waits:
        kind = "unknown"
    elif prediction is not None and prediction.mismatched:
        kind, evidence = "size", sorted({r for _, odd in prediction.mismatched for r in odd})
        call = prediction.mismatched[0][0]
        note = f"Ranks {evidence} passed other tensor sizes to {call.describe()} at step {call.step}."
    elif any(w.call == "new_group" for w in waits):
        kind, evidence, note = _classify_creation(states, waits)
    else:
        kind, evidence, note = _classify_collectives(states, waits, plan)
    culprits = blame(dead=record.died, raised=record.raised, late=stragglers if late else (), evidence=evidence,
                     waited_for=[m for w in waits for m in w.missing])
    return kind, culprits, note


def _classify_creation(states: list, waits: list[Wait]) -> tuple[str, list[int], str]:
    diverged = _mesh_divergence(states)
    if diverged is not None:
        return diverged
    creating = [w for w in waits if w.call == "new_group"]
    # Ranks disagree about which group a name stands for (rank maps that differ across ranks).
    for w in creating:
        camps: dict[tuple[int, ...], list[int]] = {}
        for s in states:
            ranks = s.created.get(w.group_name)
            if ranks is not None:
                camps.setdefault(ranks, []).append(s.rank)
        if len(camps) > 1:
            return "inconsistent", _smaller_camps(list(camps.values())), ""
    # The same group under another name: some ranks created groups that others skipped, so the group
    # counters drifted. Those that skipped (fewer creations) are at fault.
    counts = {s.rank: s.groups_created for s in states}
    involved = {m for w in creating for m in w.group_ranks}
    top = max(counts[r] for r in involved)
    behind = sorted(r for r in involved if counts[r] < top)
    return "subset", behind or sorted({m for w in creating for m in w.missing}), ""


def _mesh_divergence(states: list) -> tuple[str, list[int], str] | None:
    """Compare the meshes each rank built (shape and ranks), in order; the first disagreement explains.

    A rank waiting to create the groups of an earlier mesh has not got there yet and is left out.
    """
    depth = max((len(s.meshes) for s in states), default=0)
    for k in range(depth):
        camps: dict[Any, list[int]] = {}
        for s in states:
            if len(s.meshes) > k:
                camps.setdefault(_mesh_key(s.meshes[k]), []).append(s.rank)
            elif not (s.call is not None and s.call.kind == "new_group"):
                camps.setdefault(None, []).append(s.rank)  # moved on without building it
        if len(camps) < 2:
            continue
        built = {key: ranks for key, ranks in camps.items() if key is not None}
        note = _describe_camps(camps)
        if None in camps and len(built) == 1:
            return "subset", sorted(camps[None]), note
        for key, ranks in built.items():
            ahead = [s for s in states if s.rank not in ranks and len(s.meshes) > k + 1]
            if any(_mesh_key(s.meshes[k + 1]) == key for s in ahead):
                return "subset", sorted(ranks + camps.get(None, [])), note  # they skipped a mesh the others built
        return "inconsistent", _smaller_camps(list(camps.values())), note
    return None


def _describe_camps(camps: dict) -> str:
    parts = []
    for key, ranks in sorted(camps.items(), key=lambda kv: -len(kv[1])):
        who = f"rank{'s' if len(ranks) > 1 else ''} {_ranks_text(ranks)}"
        if key is None:
            parts.append(f"{who} built no mesh there")
        else:
            shape, members = key
            parts.append(f"{who} built a {tuple(shape)} mesh over {_ranks_text(sorted(set(members)))}")
        if len(parts) == 3:
            break
    return "The meshes disagree: " + "; ".join(parts) + "."


def _ranks_text(ranks: list[int]) -> str:
    from ..report import ranks_text

    return ranks_text(ranks)


def _mesh_key(entry: tuple) -> tuple:
    _, shape, _, ranks = entry
    return (tuple(shape), tuple(ranks))


def _smaller_camps(camps: list[list[int]]) -> list[int]:
    """Every camp but the largest (all of them when no camp is larger than the rest)."""
    largest = max(len(c) for c in camps)
    if sum(1 for c in camps if len(c) == largest) > 1:
        return sorted(r for c in camps for r in c)
    return sorted(r for c in camps if len(c) < largest for r in c)


def _classify_collectives(states: list, waits: list[Wait], plan: Any) -> tuple[str, list[int], str]:
    """Follow who waits for whom to the root of the wait.

    A rank whose missing peers wait on *other* groups is only downstream of the problem. Waits whose
    missing peers are elsewhere (finished, another step) or on the same group at another call are roots:
    someone skipped or mismatched a collective there. With no root at all, ranks wait on each other in
    different groups: calls made in a different order.
    """
    waiting = {w.rank: w for w in waits}
    divergent = divergent_ranks(plan, len(states)) if plan is not None else set()

    def downstream(w: Wait) -> bool:
        return bool(w.missing) and all(m in waiting and waiting[m].group_name != w.group_name for m in w.missing)

    roots = [w for w in waits if not downstream(w)]
    if not roots:
        camps = Counter(w.group_name for w in waits)
        (first, _), = camps.most_common(1)
        minority = sorted(w.rank for w in waits if w.group_name != first)
        return "reordered", sorted(divergent & set(waiting)) or minority, ""
    culprits: set[int] = set()
    for w in roots:
        culprits |= _first_divergence(states, w, divergent)
    return "skipped", sorted(culprits) or sorted({m for w in roots for m in w.missing}), ""


def _first_divergence(states: list, wait: Wait, divergent: set[int]) -> set[int]:
    """On the waited-for group, the members whose calls part from the majority's first.

    A rank that skipped a collective makes its next call on that group from a later step (or never),
    so at the first position where members disagree it is the odd one out. Between camps of equal size,
    the plan's divergent ranks decide, else the camp that got there from a later step (it skipped).
    """
    members = wait.group_ranks
    depth = max(states[m].calls_on.get(wait.group_name, 0) for m in members)
    for seq in range(depth):
        seen = {m: states[m].call_log.get((wait.group_name, seq)) for m in members}
        camps = Counter(seen.values())
        if len(camps) < 2:
            continue
        top = max(camps.values())
        leaders = [v for v, n in camps.items() if n == top]
        if len(leaders) == 1:
            return {m for m, v in seen.items() if v != leaders[0]}
        odd = {m for m in members if m in divergent}
        if odd:
            return odd
        latest = max((v for v in leaders if v is not None), key=lambda v: (v[0] is not None, v[0] or 0),
                     default=None)
        return {m for m, v in seen.items() if v == latest or v is None}
    return set()


def _last_words(state: Any) -> str:
    """For a rank that died, the last line it printed (a C++ abort says why)."""
    if state.end != DIED or not state.output.strip():
        return ""
    lines = [line.strip() for line in state.output.strip().splitlines() if line.strip()]
    return f"; it printed: {lines[-1][:300]}"


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
        if "meshsim/run/rank.py" in block and " in watch" in block:
            continue  # the lifeline watcher thread
        if "meshsim/run/torchrun.py" in block and " in own_stack" in block:
            continue  # the torchrun watchdog, taking this very dump
        lines = []
        for line in block.splitlines():
            if any(part in line for part in ("meshsim/run/rank.py", "multiprocessing/", "meshsim/run/torchrun.py",
                                             "<frozen runpy>")):
                break  # below here: meshsim's command loop and process bootstrap
            if any(part in line for part in ("meshsim/run/progress.py", "c10d_logger.py", "meshsim/run/simgpu.py",
                                             "torch/overrides.py")):
                continue  # the instrumentation wrapper
            lines.append(line.rstrip())
        if len(lines) == 1 and lines[0].rstrip().endswith("(most recent call first):"):
            lines.append("  (no frame of the user's code: the rank is in meshsim's own loop, or in C++ it called)")
        kept.append("\n".join(lines))
    text = "\n\n".join(k for k in kept if k.strip())
    return re.sub(r"0x[0-9a-f]+", "0x…", text)


def headline_wait(waits: list[Wait], culprits: list[int]) -> Wait | None:
    """The wait that shows the root cause: on the group where a culprit is missing (not a side effect of it)."""
    for w in waits:
        if set(w.missing) & set(culprits):
            return w
    return waits[0] if waits else None


def _summary(d: Diagnosis, states: list) -> str:
    who = ", ".join(map(str, d.culprits)) or "none identified"
    lead = "; ".join(f"rank {r} {states[r].where}" for r in d.culprits[:3]
                     if states[r].end in (DIED, RAISED) or d.kind == KINDS["straggler"])
    w = headline_wait(d.waits, d.culprits)
    if w is None:
        return f"{d.kind}: {lead + '. ' if lead else ''}Culprit ranks: {who}."
    where = f" (mesh {w.mesh!r}, dim {w.mesh_dim!r}" + (f", coordinate {w.group_coordinate})" if w.group_coordinate else ")") \
        if w.mesh is not None else ""
    missing = ", ".join(f"{m} {states[m].where}" for m in w.missing[:4]) or "nobody"
    more = f" (and {len(d.waits) - 1} more waiting ranks)" if len(d.waits) > 1 else ""
    at = {"function": "in the user function", "script": "in the script"}.get(w.op, f"at step {w.step} ({w.op})")
    return (f"{d.kind}: {lead + '; ' if lead else ''}rank {w.rank} waits in {w.call} on group {w.group_ranks}"
            f"{where} {at}{more}; missing: {missing}. Culprit ranks: {who}.")
