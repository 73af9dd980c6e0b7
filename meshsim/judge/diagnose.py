"""Why a run did not finish: who waits where, for whom, who is to blame (meshsim.judge.blame), and the stacks.

Built from the record (meshsim.core.record) alone, so it reads a plan, a user function, a script, a torchrun job and
a replayed incident the same way. A plan, when there is one, only adds mesh coordinates and a tie-breaker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..core import pace
from ..core.outcome import KINDS
from ..core.ranks import group_text, ranks_text
from ..core.record import RankState, RunRecord, name_helper_calls
from ..core.wire import DIED, RAISED
from ..model import torch_side
from .blame import Blame, Cause, blame, blocked_call, missing_from

__all__ = ["KINDS", "Diagnosis", "Wait", "diagnose", "headline_wait"]


@dataclass
class Wait:
    rank: int
    step: int | None
    op: str | None  # the plan step's op (or "function", "script")
    call: str  # the collective, or new_group
    group_ranks: list[int]
    group_name: str
    mesh: str | None
    mesh_dim: Any
    group_coordinate: list[Any] | None
    missing: list[int]
    seq: int = 0  # the call's position on its group
    site: str | int | None = None  # where in the user's code (a plan's step)
    raised: bool = False  # the call raised on this rank (a peer left) rather than waiting on
    cause: bool = False  # the call (or group) the headline cause names: a culprit is missing, or added it

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "step": self.step, "op": self.op, "call": self.call, "seq": self.seq,
                "group_ranks": self.group_ranks, "group": self.group_name, "mesh": self.mesh,
                "mesh_dim": self.mesh_dim, "group_coordinate": self.group_coordinate, "missing": self.missing,
                "site": self.site, "raised": self.raised}


@dataclass
class Diagnosis:
    kind: str
    culprits: list[int]
    summary: str
    waits: list[Wait] = field(default_factory=list)
    elsewhere: dict[int, str] = field(default_factory=dict)  # where the ranks that are not waiting are
    stacks: list[tuple[list[int], str]] = field(default_factory=list)
    victims: dict[int, str] = field(default_factory=dict)  # what a rank that is not to blame did
    causes: list[Cause] = field(default_factory=list)  # why each culprit is one, the headline first
    candidates: list[Cause] = field(default_factory=list)  # where the evidence cannot decide: who may be, and why
    paces: list[pace.RankPace] = field(default_factory=list)  # a run too slow for its deadline: each rank's pace
    suggested_deadline: float | None = None  # the deadline such a run needs, where its length is known

    @property
    def mesh_dim(self) -> Any:
        """The mesh dim of the group the headline cause is on (None: no mesh dim there)."""
        wait = headline_wait(self.waits, self.culprits)
        return wait.mesh_dim if wait is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "culprit_ranks": self.culprits, "summary": self.summary,
                "mesh_dim": self.mesh_dim,
                "causes": [c.to_json() for c in self.causes],
                "candidates": [c.to_json() for c in self.candidates],
                "waiting": [w.to_json() for w in self.waits],
                "elsewhere": {str(r): where for r, where in sorted(self.elsewhere.items())},
                "victims": {str(r): what for r, what in sorted(self.victims.items())},
                "pace": [{"rank": p.rank, "completed": p.completed, "calls_per_s": p.rate, "quiet_s": p.quiet,
                          "finished": p.finished} for p in self.paces],
                "suggested_deadline_s": self.suggested_deadline,
                "stacks": [{"ranks": ranks, "stack": text} for ranks, text in self.stacks]}


def diagnose(record: RunRecord, plan: Any = None, prediction: Any = None) -> Diagnosis:
    if record.still_moving:
        return _too_slow(record, plan)
    states = record.states
    name_helper_calls(states)
    waits = [_wait(s, states, plan, prediction) for s in states if blocked_call(s) is not None]
    waiting = {w.rank for w in waits}
    elsewhere = {s.rank: s.where + _last_words(s) for s in states if s.rank not in waiting}
    divergent: set[int] = set()
    if plan is not None:
        from ..model.predict import divergent_ranks

        divergent = divergent_ranks(plan, record.world)
    sizes = sorted({r for _, odd in prediction.mismatched for r in odd}) if prediction is not None else []
    collided = prediction.collided if prediction is not None else []
    try:
        found = blame(record, divergent, sizes, collided)
    except Exception as exc:  # the culprit rule's own bug is a verdict too, never a traceback: no culprit named
        found = Blame(KINDS["unknown"], [], f"meshsim's culprit rule failed on this record ({type(exc).__name__}: "
                      f"{exc}); the waits are as recorded.")
    if record.classes is not None:  # the ranks of a culprit's class run as it does: culprits all
        found.culprits = record.classes.expand(found.culprits)
    note = found.note
    if sizes:
        call = prediction.mismatched[0][0]
        note = f"Ranks {sizes} passed other tensor sizes to {call.describe()} at step {call.step}."
    elif collided:
        note = (f"Step {prediction.undefined_from} made different groups under one name on ranks "
                f"{ranks_text(collided)} (finding group-name-collision): gloo crosses them.")
    diagnosis = Diagnosis(found.kind, found.culprits, "", waits, elsewhere, _group_stacks(record.stacks),
                          found.victims, found.causes, found.candidates)
    _mark_cause(diagnosis)
    diagnosis.summary = _summary(diagnosis, states) + (f" {note}" if note else "")
    return diagnosis


def _wait(state: RankState, states: list[RankState], plan: Any, prediction: Any) -> Wait:
    call = blocked_call(state)
    assert call is not None
    mesh, dim = (call.context or (None, None))[:2]
    learned = call.context[2] if call.context is not None and len(call.context) > 2 else None
    if call.kind == "new_group" and isinstance(dim, str) and dim.startswith("mesh_"):
        dim = dim[len("mesh_"):]
        dim = int(dim[4:]) if re.fullmatch(r"dim_\d+", dim) else dim
    coordinate = learned or _group_coordinate(state, plan, prediction, mesh, dim)
    return Wait(state.rank, state.step, state.op, call.kind, list(call.ranks), call.group, mesh, dim, coordinate,
                missing_from(call, states), call.seq, call.site, state.end == RAISED)


def _group_coordinate(state: RankState, plan: Any, prediction: Any, handle: str | None, dim: Any) -> list[Any] | None:
    """The group's place in its mesh: this rank's coordinate with the group's dim as '*'."""
    if plan is None or prediction is None or handle is None or dim is None or state.step is None:
        return None
    for index in range(min(state.step, len(plan.steps) - 1), -1, -1):
        if plan.steps[index].out == handle:
            summary = torch_side(prediction.expected(state.rank, index))
            if not isinstance(summary, dict) or summary.get("coordinate") is None:
                return None
            coordinate: list[Any] = list(summary["coordinate"])
            names = summary.get("names") or []
            position = names.index(dim) if isinstance(dim, str) and dim in names else dim
            if isinstance(position, int) and -len(coordinate) <= position < len(coordinate):
                coordinate[position] = "*"
                return coordinate
            return None
    return None


def _last_words(state: RankState) -> str:
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
            if any(part in line for part in ("meshsim/compat/", "c10d_logger.py",
                                             "torch/overrides.py")):
                continue  # the instrumentation wrapper
            lines.append(line.rstrip())
        if len(lines) == 1 and lines[0].rstrip().endswith("(most recent call first):"):
            lines.append("  (no frame of the user's code: the rank is in meshsim's own loop, or in C++ it called)")
        kept.append("\n".join(lines))
    text = "\n\n".join(k for k in kept if k.strip())
    return re.sub(r"0x[0-9a-f]+", "0x…", text)


def headline_wait(waits: list[Wait], culprits: list[int]) -> Wait | None:
    """The wait that shows the root cause: the one on the group the headline cause names (where a culprit is
    missing, or where it added a call), else one where a culprit is missing (not a side effect of it)."""
    for w in waits:
        if w.cause:
            return w
    for w in waits:
        if set(w.missing) & set(culprits):
            return w
    return waits[0] if waits else None


def _mark_cause(d: Diagnosis) -> None:
    """Mark the wait that shows the headline cause: on its call (group and position), else on its group where a
    culprit is missing, else a culprit's own wait on its group."""
    if not d.causes or d.causes[0].group is None:
        return
    head = d.causes[0]
    on_group = [w for w in d.waits if w.group_name == head.group]
    exact = [w for w in on_group if w.seq == head.seq]
    missing = [w for w in on_group if set(w.missing) & set(d.culprits)]
    chosen = (exact or missing or on_group)[:1]
    for w in chosen:
        w.cause = True


def _too_slow(record: RunRecord, plan: Any) -> Diagnosis:
    """Every unfinished rank was still completing calls when time ran out: no hang, and nobody to blame. Each
    rank's progress and pace, and the deadline the run needs where its length is known (a plan's steps)."""
    states = record.states
    paces = pace.of_states(states, record.ended_at)
    running = [p for p in paces if not p.finished]
    total = len(plan.steps) if plan is not None else None
    elsewhere = {p.rank: _progress_text(states[p.rank], p, total) for p in paces}
    reached = [step for p in running if (step := states[p.rank].step) is not None]
    suggested = None
    if total and reached and min(reached) > 0:  # (a step index: steps before it are done)
        suggested = _round_up(1.5 * record.elapsed * total / min(reached))
    slowest = min(running, key=lambda p: (p.completed, p.rank))
    spread = ""
    if total and reached:
        apart = max(reached) - min(reached)
        spread = f"; the ranks are within {apart} step{'s' if apart != 1 else ''} of each other"
    advice = (f" This plan of {total} steps needs about {suggested / 1.5:.0f} s here: give it a deadline of "
              f"{suggested:g} s." if suggested else
              " Its length is not known here: give it a longer deadline (or none), or a shorter workload.")
    summary = (f"{KINDS['slow']}: every rank that had not finished was still completing collectives when the "
               f"deadline of {record.deadline:g} s struck (after {record.elapsed:.1f} s); the slowest, rank "
               f"{slowest.rank}, {elsewhere[slowest.rank]}{spread}. No rank waits on another: nobody is to blame."
               + advice)
    return Diagnosis(KINDS["slow"], [], summary, [], elsewhere, [], {}, paces=paces, suggested_deadline=suggested)


def _progress_text(state: RankState, p: pace.RankPace, total: int | None) -> str:
    if p.finished:
        return "finished"
    where = f"at step {state.step} of {total}" if total and state.step is not None else \
        f"in {state.call.kind} at {state.call.site}" if state.call is not None and state.call.site else "running"
    rate = f", {pace.rate_text(p.rate)} calls/s" if p.rate is not None else ""
    return f"{where}, {p.completed} calls completed{rate}"


def _round_up(seconds: float) -> float:
    """A deadline worth typing: two significant figures, rounded up."""
    import math

    if seconds <= 10:
        return float(math.ceil(seconds))
    scale = 10 ** (len(str(int(seconds))) - 2)
    return float(math.ceil(seconds / scale) * scale)


def _summary(d: Diagnosis, states: list[RankState]) -> str:
    who = ", ".join(map(str, d.culprits)) or "none identified"
    lead = _lead([r for r in d.culprits
                  if states[r].end in (DIED, RAISED) or d.kind in (KINDS["straggler"], KINDS["left"])], states)
    w = headline_wait(d.waits, d.culprits)
    if w is None:
        return f"{d.kind}: {lead + '. ' if lead else ''}Culprit ranks: {who}."
    where = ""
    if w.mesh is not None:
        where = f" (mesh {w.mesh!r}, dim {w.mesh_dim!r}" + (f", coordinate {w.group_coordinate})"
                                                              if w.group_coordinate else ")")
    missing = ", ".join(f"{m} {states[m].where}" for m in w.missing[:4]) or "nobody"
    more = f" (and {len(d.waits) - 1} more waiting ranks)" if len(d.waits) > 1 else ""
    at = {"function": "in the user function", "script": "in the script"}.get(w.op or "", f"at step {w.step} ({w.op})")
    if isinstance(w.site, str):  # (a plan's step is said already)
        at += f" at {w.site}"
    verb = "raised" if w.raised else "waits"
    return (f"{d.kind}: {lead + '; ' if lead else ''}rank {w.rank} {verb} in {w.call} #{w.seq} on group "
            f"{group_text(w.group_ranks)}{where} {at}{more}; missing: {missing}. Culprit ranks: {who}.")


def _lead(ranks: list[int], states: list[RankState], most: int = 3) -> str:
    """Where the culprits are, ranks that ended alike said once: "ranks 4-7 raised RuntimeError: ... at x.py:13"."""
    alike: dict[str, list[int]] = {}
    for rank in ranks:
        alike.setdefault(_alike(states[rank]), []).append(rank)
    return "; ".join(f"rank{'s' if len(group) > 1 else ''} {ranks_text(group)} {states[group[0]].where}"
                     for group in list(alike.values())[:most])


def _alike(state: RankState) -> str:
    """A script's failures that differ only in numbers (ranks 4 and 5 failing on "device 4" and "device 5") are
    one failure."""
    return re.sub(r"\d+", "N", state.where) if state.end == RAISED and state.op == "script" else state.where


def culprit_ranks_text(d: Diagnosis) -> str:
    return ranks_text(d.culprits) or "none identified"
