"""Predict, for a plan and a world size, what every rank observes and how the run ends.

It runs each step's model part (meshsim.ops) on every rank of the pure model (meshsim.model), then plays the
ranks' blocking calls against each other (simulate). It sits above both: the model knows nothing of plans.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

from .model import layout as L
from .model.dtensor import DTensorModel
from .model.expect import Err, ModelRaise, Quirk
from .model.mesh import Call, Group, MeshModel, RankModel, summary
from .ops import operation_of
from .outcome import ERROR, PASS, UNDEFINED, blame, outcome_of
from .spec.plan import Plan, Step
from .spec.platform import CPU, Platform
from .wire import DIED, FINISHED, RUN_CHECK_CALL, SKIPPED

# Meshes torch accepts although it should refuse them; what follows derails.
_STATEFUL_FINDINGS = ("repeated-rank-accepted", "devicemesh-names-unchecked")


@dataclass
class RankPrediction:
    rank: int
    observations: list[Any] = field(default_factory=list)  # one per step
    end: str = FINISHED  # FINISHED | RAISED | DIED
    end_step: int | None = None
    calls: list[Call] = field(default_factory=list)
    slept: float = 0.0


@dataclass
class Stuck:
    rank: int
    call: Call
    missing: tuple[int, ...]


@dataclass
class Prediction:
    world: int
    ranks: list[RankPrediction]
    outcome: Any  # str, or a Quirk when torch ends otherwise than it should
    stuck: list[Stuck]
    mismatched: list[tuple[Call, tuple[int, ...]]]
    culprits: list[int]
    findings: set[str]
    undefined_from: int | None = None  # from this step on, other ranks' observations are not predictable
    undefined_finding: str | None = None  # ... because of this finding (None: because a rank died)
    model_error: str | None = None  # the model failed on this plan: it predicts nothing


    def expected(self, rank: int, step: int) -> Any:
        return self.ranks[rank].observations[step]


def predict(plan: Plan, world: int, deadline: float | None = None, platform: Platform = CPU) -> Prediction:
    """`platform`: the ranks' default device type, and whether they can set a CUDA device."""
    L.forget_shared()
    with no_gc():  # the world's predictions are live until the end: collecting on the way is wasted work
        return _predict(plan, world, deadline, platform)


def _predict(plan: Plan, world: int, deadline: float | None, platform: Platform = CPU) -> Prediction:
    ranks = [_run_rank(plan, rank, world, platform) for rank in range(world)]
    findings = set().union(*(r.findings for r in ranks)) if ranks else set()
    preds = [r.prediction for r in ranks]
    stuck, mismatched = simulate(preds)
    late = [p.rank for p in preds if deadline is not None and p.slept >= deadline]
    outcome = outcome_of((p.end for p in preds), hung=bool(stuck or late))
    culprits = [] if outcome == PASS else blame(
        dead=[p.rank for p in preds if p.end == DIED], raised=[p.rank for p in preds if p.end not in (FINISHED, DIED)],
        late=late, divergent=divergent_ranks(plan, world), waited_for=[m for s in stuck for m in s.missing])
    prediction = Prediction(world, preds, outcome, stuck, mismatched, culprits, findings)
    stuck_ranks = {s.rank for s in stuck}
    if any(s.call.kind == "create" for s in stuck) and any(
            p.end == FINISHED and p.rank not in stuck_ranks for p in preds):
        prediction.findings.add("mesh-shape-divergence-hangs")  # some ranks built their groups and went on
    if stuck and all(s.call.kind == RUN_CHECK_CALL for s in stuck) and not late:
        # from_local(run_check=True) gathers metadata over the default group, so a mesh that leaves ranks out
        # waits for them forever; checked within the mesh, the run would end as if nothing waited.
        prediction.findings.add("from-local-run-check-world")
        prediction.outcome = Quirk(outcome_of((p.end for p in preds), hung=False), outcome,
                                   "from-local-run-check-world")
    deaths = [min([p.end_step] + [c.step for c in p.calls[-1:]]) for p in preds if p.end == DIED]
    if deaths:
        # Peers of a dead rank see whatever their transport reports (connection closed, timeouts), from the
        # step of its last call on: a peer may still be finishing that call (a gloo connect) when it dies.
        prediction.undefined_from = min(deaths)
    if mismatched:
        # Ranks passed different tensor sizes to one all_reduce. Right: every rank is told. gloo: some
        # ranks get wrong values silently, then they hang, or one aborts the process, depending on sizes.
        prediction.findings.add("gloo-size-mismatch-silent")
        prediction.undefined_from = min(call.step for call, _ in mismatched)
        prediction.undefined_finding = "gloo-size-mismatch-silent"
        prediction.outcome = Quirk(ERROR, UNDEFINED, "gloo-size-mismatch-silent")
        return prediction
    derailed = [f for f in _STATEFUL_FINDINGS if f in findings]
    if derailed:
        # torch accepted a mesh it should have refused and derails: the right outcome is still a clean
        # pass; where torch ends up is a race.
        prediction.undefined_from = _first_step_of(preds, derailed[0])
        prediction.undefined_finding = derailed[0]
        prediction.outcome = Quirk(PASS, UNDEFINED, derailed[0])
        return prediction
    collision = name_collision(preds)
    if collision is not None and any(st.diverges for st in plan.steps[:collision + 1]):
        # The plan's own divergence made ranks create different groups under one name: what the crossed
        # groups then compute is not predictable (the outcome still is: they cannot all finish).
        earliest = prediction.undefined_from
        prediction.undefined_from = collision if earliest is None else min(earliest, collision)
    elif collision is not None:
        # Two different groups made under one name on different ranks although every rank ran the same
        # plan: gloo's rendezvous crosses them, so whether torch hangs, connects the wrong peers or gets
        # lucky is a race.
        prediction.findings.add("group-name-collision")
        prediction.undefined_from, prediction.undefined_finding = collision, "group-name-collision"
        prediction.outcome = Quirk(outcome, UNDEFINED, "group-name-collision")
    return prediction


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def unpredictable(plan: Plan, world: int, exc: BaseException) -> Prediction:
    """What stands for a prediction when the model fails on a plan: it says so, and judges nothing."""
    ranks = [RankPrediction(r, [SKIPPED] * len(plan.steps)) for r in range(world)]
    message = f"the model cannot predict this plan: {type(exc).__name__}: {exc}"
    return Prediction(world, ranks, UNDEFINED, [], [], [], set(), model_error=message)


def _first_step_of(preds: list[RankPrediction], finding: str) -> int:
    steps = [i for p in preds for i, o in enumerate(p.observations)
             if isinstance(o, Quirk) and o.finding == finding]
    return min(steps, default=0)


def predict_rank(plan: Plan, world: int, rank: int, platform: Platform = CPU) -> list[Any]:
    """One rank's predicted observations, without simulating the others (for very large worlds)."""
    return _run_rank(plan, rank, world, platform).prediction.observations


def name_collision(preds: list[RankPrediction]) -> int | None:
    """The first step at which ranks create different groups under the same name, if any."""
    seen: dict[Any, tuple[tuple, int]] = {}
    first: int | None = None
    for pred in preds:
        for call in pred.calls:
            if call.kind != "create":
                continue
            name, ranks = call.key
            known = seen.setdefault(name, (ranks, call.step))
            if known[0] != ranks:
                step = min(known[1], call.step)
                first = step if first is None else min(first, step)
    return first


# --------------------------------------------------------------------------------------------- one rank


class RankRun:
    """One rank running a plan in the model: the emulated DeviceMesh state, the handles, the prediction."""

    def __init__(self, plan: Plan, rank: int, world: int, platform: Platform = CPU):
        self.model = RankModel(rank, world, platform)
        self.prediction = RankPrediction(rank)
        self.handles: dict[str, Any] = {}
        self.plan = plan
        self.index = -1

    @property
    def findings(self) -> set[str]:
        return self.model.findings

    def end(self, how: str) -> None:
        """This rank leaves the plan at the current step (raised, or died)."""
        self.prediction.end, self.prediction.end_step = how, self.index

    def resolve(self, ref: str) -> Any:
        name, _, item = ref.partition(".")
        if name not in self.handles:
            raise ModelRaise(Err("HandleError", f"handle {name!r} does not exist on this rank"))
        value = self.handles[name]
        if item:
            if not isinstance(value, list) or int(item) >= len(value):
                raise ModelRaise(Err("HandleError", f"handle {ref!r} does not exist on this rank"))
            value = value[int(item)]
        return value

    def mesh(self, ref: str) -> MeshModel:
        value = self.resolve(ref)
        if not isinstance(value, MeshModel):
            raise ModelRaise(Err("HandleError", f"handle {ref!r} is not a mesh"))
        return value


def _run_rank(plan: Plan, rank: int, world: int, platform: Platform = CPU) -> RankRun:
    run = RankRun(plan, rank, world, platform)
    pred = run.prediction
    for index, st in enumerate(plan.steps):
        if pred.end != FINISHED or not st.runs_on(rank):
            pred.observations.append(SKIPPED)
            continue
        pred.observations.append(observe_step(run, st, st.args_for(rank), index))
    pred.calls = run.model.calls
    return run


def observe_step(run: RankRun, st: Step, args: dict, index: int) -> Any:
    """What this rank observes at one step: the op's model step, with torch's errors as values."""
    run.index = run.model.step = index
    try:
        value = operation_of(st).model(run, args)
    except ModelRaise as exc:
        if st.out:
            run.handles.pop(st.out, None)
        return exc.err
    if st.out is not None:
        run.handles[st.out] = value
    return _shape_result(run, value)


def _shape_result(run: RankRun, value: Any) -> Any:
    if isinstance(value, MeshModel):
        return summary(value)
    if isinstance(value, list) and value and isinstance(value[0], MeshModel):
        return [summary(m) for m in value]
    if isinstance(value, DTensorModel):
        return value.observation(run.model.rank)
    if isinstance(value, Group):
        return {"ranks": list(value.ranks), "group_rank": value.group_rank(run.model.rank)}
    return value




# --------------------------------------------------------------------------------------------- the whole world


def simulate(preds: list[RankPrediction]) -> tuple[list[Stuck], list[tuple[Call, tuple[int, ...]]]]:
    """Run every rank's blocking calls against each other; return who is left waiting, and mismatches.

    A call completes when every member of its group is at the same call (same group, same position in
    that group's sequence, same op). Members of an all_reduce that disagree only on the tensor size
    complete it anyway (gloo does not check) and are reported as mismatched. Event-driven: each rank
    arrives at its next call once, so the whole world costs one pass over all calls.
    """
    pos = [0] * len(preds)
    mismatched: list[tuple[Call, tuple[int, ...]]] = []
    waiting: dict[tuple, list[int]] = {}
    ready = list(range(len(preds)))
    while ready:
        rank = ready.pop()
        calls = preds[rank].calls
        if pos[rank] >= len(calls):
            continue
        call = calls[pos[rank]]
        arrived = waiting.setdefault(call.key, [])
        arrived.append(rank)
        if len(arrived) < len(call.members):
            continue
        at = [preds[m].calls[pos[m]] for m in arrived]
        if any(c.kind != call.kind for c in at):
            continue
        if call.kind != "all_reduce" and any(c.detail != call.detail for c in at):
            continue
        del waiting[call.key]
        if call.kind == "all_reduce":
            usual = Counter(c.detail for c in at).most_common(1)[0][0]  # the majority's size is the norm
            odd = tuple(sorted(m for m, c in zip(arrived, at) if c.detail != usual))
            if odd:
                mismatched.append((preds[min(arrived)].calls[pos[min(arrived)]], odd))
        for m in arrived:
            pos[m] += 1
        ready.extend(arrived)

    def current(rank: int) -> Call | None:
        calls = preds[rank].calls
        return calls[pos[rank]] if pos[rank] < len(calls) else None

    stuck = []
    for rank in range(len(preds)):
        call = current(rank)
        if call is not None:
            missing = tuple(m for m in call.members
                            if current(m) is None or (current(m).key, current(m).kind) != (call.key, call.kind))
            stuck.append(Stuck(rank, call, missing))
    return stuck, mismatched


def divergent_ranks(plan: Plan, world: int) -> set[int]:
    """The ranks at fault when a plan's divergence hangs a run.

    Group creation needs every rank, so those that skip it are at fault; for anything else, the minority that
    does something the others do not.
    """
    culprits: set[int] = set()
    for st in plan.steps:
        if not st.diverges:
            continue
        runs = {r for r in range(world) if st.runs_on(r)}
        skipped = set(range(world)) - runs
        odd = set(st.on_rank) & runs
        if operation_of(st).creates_groups or len(runs) * 2 > world:
            culprits |= odd | skipped
        else:
            culprits |= odd | runs
    return culprits
