"""Predict, for a plan and a world size, what every rank observes and how the run ends.

It runs each step's model part (meshsim.ops) on every rank of the pure model (meshsim.model), then plays the
ranks' blocking calls against each other (simulate). It sits above both: the model knows nothing of plans.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.outcome import ERROR, PASS, UNDEFINED, outcome_of
from ..core.record import RankState, RunRecord
from ..core.wire import DIED, FINISHED, RUN_CHECK_CALL, SKIPPED, STUCK, CallBegun
from ..judge.blame import blame
from ..ops import operation_of
from ..spec.plan import Plan, Step
from ..spec.platform import CPU, Platform
from . import layout as L
from .dtensor import DTensorModel, forget_sims
from .expect import Err, Grid, ModelRaise, Quirk
from .mesh import Call, Group, MeshModel, RankModel, summary

Chosen = dict[int, Any]  # step -> what torch chose there, where the choice is torch's (meshsim.model.choices)

# Meshes torch accepts although it should refuse them; what follows derails.
_STATEFUL_FINDINGS = ("repeated-rank-accepted", "devicemesh-names-unchecked")


@dataclass
class RankPrediction:
    rank: int
    observations: list[Any] = field(default_factory=list)  # one per step
    end: str = FINISHED  # FINISHED | RAISED | DIED
    end_step: int | None = None
    calls: list[Call] = field(default_factory=list)
    meshes: list[tuple[Any, ...]] = field(default_factory=list)  # what torch's progress reports as MeshBuilt
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
    model_error_step: int | None = None  # ... at this step
    late: list[int] = field(default_factory=list)  # ranks still sleeping at the deadline (stragglers)
    collided: list[int] = field(default_factory=list)  # ranks that made groups under one name (group-name-collision)
    classes: Any = None  # meshsim.model.classes.RankClasses when predicted by class: ranks is then a ClassView
    notes: list[str] = field(default_factory=list)  # how it was predicted, where that is worth saying

    def expected(self, rank: int, step: int) -> Any:
        return self.ranks[rank].observations[step]

    def as_record(self, deadline: float, tier: str = "model", plan: Plan | None = None) -> RunRecord:
        """The run the model predicts, as the record an executor would return: every rank's observations as torch
        is predicted to report them, and the stuck ranks in the calls the model says they wait in, with the calls
        every rank made on every group up to there (the judge's culprit rule reads those)."""
        states: Any = _states(self, with_calls=bool(self.stuck or self.late), plan=plan)
        if self.classes is not None:
            from .classes import ClassView

            states = ClassView(self.classes, states)
        for rank in self.late:  # asleep past the deadline, outside any call
            states[rank].end, states[rank].done = STUCK, False
        record = RunRecord(self.world, deadline, states, 0.0, bool(self.stuck or self.late), tier=tier)
        record.classes = self.classes
        return record


def predict(plan: Plan, world: int, deadline: float | None = None, platform: Platform = CPU,
            by_class: bool = False, chosen: Chosen | None = None) -> Prediction:
    """`platform`: the ranks' default device type, and whether they can set a CUDA device. `by_class`: answer
    each class of ranks that run the plan alike once (meshsim.model.classes; the model tier at scale): the prediction's
    ranks are then a ClassView, and every rank's observations are its representative's. `chosen`: what torch
    chose at steps where the choice is torch's (meshsim.model.choices), predicted as torch chose it."""
    chosen = chosen or {}
    L.forget_shared()
    forget_sims()
    with no_gc():  # the world's predictions are live until the end: collecting on the way is wasted work
        if by_class:
            from .classes import Unclassable

            try:
                return _predict_by_class(plan, world, deadline, platform, chosen)
            except Unclassable as exc:
                prediction = _predict(plan, world, deadline, platform, chosen)
                prediction.notes.append(f"predicted rank by rank: {exc}")
                return prediction
        return _predict(plan, world, deadline, platform, chosen)


def _predict(plan: Plan, world: int, deadline: float | None, platform: Platform = CPU,
             chosen: Chosen | None = None) -> Prediction:
    ranks = [_run_rank(plan, rank, world, platform, chosen) for rank in range(world)]
    findings = set().union(*(r.findings for r in ranks)) if ranks else set()
    preds = [r.prediction for r in ranks]
    stuck, mismatched = simulate(preds)
    return _conclude(plan, world, deadline, preds, findings, stuck, mismatched)


def _predict_by_class(plan: Plan, world: int, deadline: float | None, platform: Platform = CPU,
                      chosen: Chosen | None = None) -> Prediction:
    from .classes import Classifier, ClassView, Unclassable, check_classes, lockstep

    def run(rank: int) -> RankRun:
        return _run_rank(plan, rank, world, platform, chosen)

    classifier = Classifier(plan, world, run)
    classes = classifier.settle(compositions=False)
    runs = classifier.runs_of(classes)
    check_classes(classes, runs, run)
    derailed = sorted({f for r in runs.values() for f in r.findings if f in _STATEFUL_FINDINGS})
    if derailed:
        # A mesh torch should have refused (a rank named twice: groups of one dim that overlap) breaks what
        # classes rest on, one group a dim for every rank; such plans are small, and predicted rank by rank.
        raise Unclassable(f"torch accepted a mesh it should refuse ({derailed[0]})")
    stuck: list[Stuck] = []
    mismatched: list[tuple[Call, tuple[int, ...]]] = []
    if not lockstep(classes, runs):  # (in lockstep, one SPMD program: every call completes, whatever its group)
        # split classes until each group of a kind holds the same classes, and play the calls by class
        classes = classifier.settle(compositions=True)
        runs = classifier.runs_of(classes)
        check_classes(classes, runs, run)
        stuck, mismatched = _simulate_by_class(classes, runs)
    findings: set[str] = set().union(*(r.findings for r in runs.values()))
    preds = ClassView(classes, [runs[rank].prediction for rank in classes.reps],
                      exact=lambda rank: run(rank).prediction)
    prediction = _conclude(plan, world, deadline, preds, findings, stuck, mismatched, classes)
    prediction.notes.append(f"model: {world:,} ranks predicted as {len(classes)} class"
                            f"{'es' if len(classes) > 1 else ''} of ranks that run the plan alike")
    return prediction


def _simulate_by_class(classes: Any, runs: dict[int, RankRun]
                       ) -> tuple[list[Stuck], list[tuple[Call, tuple[int, ...]]]]:
    """simulate() played by classes (meshsim.model.classes.class_calls), answered in ranks: the stuck representatives in
    their own calls, missing the ranks of their group whose classes are not there; mismatched calls with the
    ranks of the classes that passed other sizes."""
    from .classes import class_calls, concrete, ranks_missing

    held, odd = simulate([RankPrediction(cls, calls=calls) for cls, calls in enumerate(class_calls(classes, runs))])
    stuck = [Stuck(classes.reps[s.rank], concrete(s.call), ranks_missing(classes, concrete(s.call), s.missing))
             for s in held]
    mismatched = [(concrete(call), tuple(m for m in concrete(call).members if classes.of(m) in ranks))
                  for call, ranks in odd]
    return stuck, mismatched


def _conclude(plan: Plan, world: int, deadline: float | None, preds: Any, findings: set[str], stuck: list[Stuck],
              mismatched: list[tuple[Call, tuple[int, ...]]], classes: Any = None) -> Prediction:
    """From every rank's run (or every class's: `preds` a ClassView, iterating representatives) and the
    simulation of their blocking calls: the outcome, the culprits and the findings about the world."""
    late = [p.rank for p in preds if deadline is not None and p.slept >= deadline]
    outcome = outcome_of((p.end for p in preds), hung=bool(stuck or late))
    prediction = Prediction(world, preds, outcome, stuck, mismatched, [], findings, late=late, classes=classes)
    if outcome != PASS:
        record = prediction.as_record(deadline or 0.0)
        sizes = [r for _, odd in mismatched for r in odd]
        culprits = blame(record, divergent_ranks(plan, world), sizes).culprits
        prediction.culprits = classes.expand(culprits) if classes is not None else culprits
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
    deaths = [min([p.end_step if p.end_step is not None else len(plan.steps)] + [c.step for c in p.calls[-1:]])
              for p in preds if p.end == DIED]
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
        prediction.culprits = sorted({r for _, odd in mismatched for r in odd})
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
        prediction.collided = collision_ranks(preds, collision)
        if outcome != PASS:
            prediction.culprits = prediction.collided
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


class ModelFailure(Exception):
    """The model itself failed (its own bug, or a case it does not cover) at one step of the plan."""

    def __init__(self, step: int, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.step, self.cause = step, cause


def unpredictable(plan: Plan, world: int, exc: BaseException, by_class: bool = False) -> Prediction:
    """What stands for a prediction when the model fails on a plan: it says so, at the step it failed at, and
    judges nothing."""
    step = exc.step if isinstance(exc, ModelFailure) else None
    cause = exc.cause if isinstance(exc, ModelFailure) else exc
    message = f"the model cannot predict this plan: {type(cause).__name__}: {cause}"
    classes, ranks = None, [RankPrediction(r, [SKIPPED] * len(plan.steps)) for r in range(1 if by_class else world)]
    if by_class:
        from .classes import ClassView, one_class

        classes = one_class(world)
        ranks = ClassView(classes, ranks)  # type: ignore[assignment]
    return Prediction(world, ranks, UNDEFINED, [], [], [], set(), model_error=message, model_error_step=step,
                      classes=classes)


def _first_step_of(preds: list[RankPrediction], finding: str) -> int:
    steps = [i for p in preds for i, o in enumerate(p.observations)
             if isinstance(o, Quirk) and o.finding == finding]
    return min(steps, default=0)


def predict_rank(plan: Plan, world: int, rank: int, platform: Platform = CPU) -> list[Any]:
    """One rank's predicted observations, without simulating the others (for very large worlds)."""
    return _run_rank(plan, rank, world, platform).prediction.observations


def collision_ranks(preds: list[RankPrediction], step: int) -> list[int]:
    """The ranks that made, at `step`, a group under a name other ranks gave a different group: where the crossed
    groups leave the run is a race, so a hang is theirs, whichever ranks happen to wait."""
    made: dict[Any, dict[tuple[Any, ...], set[int]]] = {}
    for pred in preds:
        for call in pred.calls:
            if call.kind == "create" and call.step == step:
                name, ranks = call.key
                made.setdefault(name, {}).setdefault(ranks, set()).add(pred.rank)
    return sorted({r for groups in made.values() if len(groups) > 1 for creators in groups.values() for r in creators})


def name_collision(preds: list[RankPrediction]) -> int | None:
    """The first step at which ranks create different groups under the same name, if any."""
    seen: dict[Any, tuple[tuple[Any, ...], int]] = {}
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

    def __init__(self, plan: Plan, rank: int, world: int, platform: Platform = CPU, chosen: Chosen | None = None):
        self.model = RankModel(rank, world, platform)
        self.chosen: Chosen = chosen or {}  # step -> what torch chose there (meshsim.model.choices)
        self.prediction = RankPrediction(rank)
        self.handles: dict[str, Any] = {}
        self.plan = plan
        self.index = -1
        self.step: Step | None = None  # the step being observed
        # where torch raises inside a step the model otherwise carries out (its right value), the error and finding
        self.refusal: Quirk | None = None

    def args_of(self, rank: int, own: dict[str, Any]) -> dict[str, Any]:
        """The current step's arguments as `rank` gets them (its on_rank overrides): every rank simulates what
        each member passes to DTensor. `own`: this rank's, the answer when no step is being observed."""
        return self.step.args_for(rank) if self.step is not None else own

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
            if isinstance(value, MeshModel):
                L.named_by_plan(value.rank_map)  # one submesh, by its index: where a rank sits in it matters
        return value

    def mesh(self, ref: str) -> MeshModel:
        value = self.resolve(ref)
        if not isinstance(value, MeshModel):
            raise ModelRaise(Err("HandleError", f"handle {ref!r} is not a mesh"))
        return value


def _run_rank(plan: Plan, rank: int, world: int, platform: Platform = CPU, chosen: Chosen | None = None
              ) -> RankRun:
    run = RankRun(plan, rank, world, platform, chosen)
    pred = run.prediction
    for index, st in enumerate(plan.steps):
        if pred.end != FINISHED or not st.runs_on(rank):
            pred.observations.append(SKIPPED)
            continue
        pred.observations.append(observe_step(run, st, st.args_for(rank), index))
    pred.calls, pred.meshes = run.model.calls, run.model.meshes
    return run


def observe_step(run: RankRun, st: Step, args: dict[str, Any], index: int) -> Any:
    """What this rank observes at one step: the op's model step, with torch's errors as values."""
    run.index = run.model.step = index
    run.step = st
    run.refusal = None
    try:
        value = operation_of(st).model(run, args)
        if run.refusal is not None:  # torch raised inside the step: the right value is what it should have given
            raise ModelRaise(Quirk(_shape_result(run, value), run.refusal.torch, run.refusal.finding))
        if st.out is not None:
            run.handles[st.out] = value
        if isinstance(value, DTensorModel):
            run.model.touched[id(value)] = value  # its blocks depend on where the rank sits in the mesh
        return _shape_result(run, value)
    except ModelRaise as exc:
        if st.out:
            run.handles.pop(st.out, None)
        return exc.err
    except Exception as exc:  # the model's own failure, or a case it does not cover: say at which step
        raise ModelFailure(index, exc) from exc


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


def size_unchecked(kind: str) -> bool:
    """Collectives whose members may pass different sizes without gloo telling them: an all_reduce, and DTensor's
    collectives (their detail is the size each member passes, where it matters)."""
    return kind == "all_reduce" or kind.startswith("dtensor")


def simulate(preds: list[RankPrediction]) -> tuple[list[Stuck], list[tuple[Call, tuple[int, ...]]]]:
    """Run every rank's blocking calls against each other; return who is left waiting, and mismatches.

    A call completes when every member of its group is at the same call (same group, same position in
    that group's sequence, same op). Members of an all_reduce (or a DTensor collective) that disagree only on
    the tensor size complete it anyway (gloo does not check) and are reported as mismatched. Event-driven: each rank
    arrives at its next call once, so the whole world costs one pass over all calls.
    """
    pos = [0] * len(preds)
    mismatched: list[tuple[Call, tuple[int, ...]]] = []
    waiting: dict[tuple[Any, ...], list[int]] = {}
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
        if not size_unchecked(call.kind) and any(c.detail != call.detail for c in at):
            continue
        del waiting[call.key]
        if size_unchecked(call.kind):
            sizes: Counter[Any] = Counter()
            for c in at:  # the majority's size is the norm (a call of a class of ranks counts its ranks)
                sizes[c.detail] += getattr(c, "weight", 1)
            usual = sizes.most_common(1)[0][0]
            odd = tuple(sorted(m for m, c in zip(arrived, at) if c.detail != usual))
            if odd:
                mismatched.append((preds[min(arrived)].calls[pos[min(arrived)]], odd))
        for m in arrived:
            pos[m] += 1
        ready.extend(arrived)

    def current(rank: int) -> Call | None:
        calls = preds[rank].calls
        return calls[pos[rank]] if pos[rank] < len(calls) else None

    def at_same(member: int, call: Call) -> bool:
        theirs = current(member)
        return theirs is not None and (theirs.key, theirs.kind) == (call.key, call.kind)

    stuck = []
    for rank in range(len(preds)):
        waits_in = current(rank)
        if waits_in is not None:
            stuck.append(Stuck(rank, waits_in, tuple(m for m in waits_in.members if not at_same(m, waits_in))))
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
        skip = {r for r in st.skip_on if 0 <= r < world}
        if st.only_on is None:  # (every rank but a few: never list the world)
            runs_count, skipped = world - len(skip), skip
            runs: set[int] | None = None
        else:
            runs = {r for r in st.only_on if 0 <= r < world} - skip
            runs_count, skipped = len(runs), set(range(world)) - runs
        odd = {r for r in st.on_rank if isinstance(r, int) and 0 <= r < world and st.runs_on(r)}
        if operation_of(st).creates_groups or runs_count * 2 > world:
            culprits |= odd | skipped
        else:
            culprits |= odd | (runs if runs is not None else set(range(world)) - skip)
    return culprits


def _states(prediction: Prediction, with_calls: bool, plan: Plan | None = None) -> list[RankState]:
    seen: dict[int, Any] = {}
    stuck_in = {stuck.rank: stuck.call for stuck in prediction.stuck}
    states = []
    for pred in prediction.ranks:
        state = RankState(pred.rank, observations=[_as_observed(o, seen) for o in pred.observations],
                          end=pred.end, end_step=pred.end_step, done=True)
        if pred.end == DIED:
            state.exitcode = 1
        if with_calls:
            _replay_calls(state, pred, stuck_in.get(pred.rank))
        held = stuck_in.get(pred.rank)
        if held is not None:
            state.end, state.done, state.step = STUCK, False, held.step
            state.op = plan.steps[held.step].op if plan is not None and 0 <= held.step < len(plan.steps) else None
            state.call = _call_begun(held)
        states.append(state)
    return states


def _replay_calls(state: RankState, pred: RankPrediction, held: Call | None) -> None:
    """The rank's progress as torch's would have reported it: every call up to the one it is held in (the model
    lists the calls the plan makes, those it would never reach included)."""
    last = next(i for i, c in enumerate(pred.calls) if c is held) if held is not None else len(pred.calls) - 1
    reached = pred.calls[:last + 1]
    until = reached[-1].step if reached else -1
    state.meshes = [m for m in pred.meshes if m[0] <= until]
    for call in reached:
        state.on_event(_call_begun(call))
    state.call = None


def _call_begun(call: Call) -> CallBegun:
    """A model call as the progress message a rank would have sent before it: its group named by the group's
    creation counter (or "world"), its position on that group, and its step as the site."""
    if call.kind == "create":
        desc = call.detail[0] if call.detail else None
        return CallBegun("new_group", tuple(call.members), str(call.key[0]), 0, (None, desc), None)
    return CallBegun(call.kind, tuple(call.members), str(call.key[0]), call.key[-1], call.context, call.step)


def _as_observed(value: Any, seen: dict[int, Any]) -> Any:
    """A predicted value as torch would have reported it. Values without a Quirk or an Err come back as the same
    object (the verdict then compares by identity: a 100,000-rank view is not walked once per rank)."""
    if isinstance(value, Quirk):
        return _as_observed(value.right if value.torch == UNDEFINED else value.torch, seen)
    if isinstance(value, Err):
        return {"error": [value.type or "Exception", value.match]}
    if not isinstance(value, (list, dict)) or type(value) is Grid:
        return value  # (a Grid holds ranks alone)
    hit = seen.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    if isinstance(value, list):
        parts = [_as_observed(v, seen) for v in value] if value and isinstance(value[0], (list, dict, Quirk, Err)) \
            else value
        out: Any = value if parts is value or all(a is b for a, b in zip(parts, value)) else parts
    else:
        items = {k: _as_observed(v, seen) for k, v in value.items()}
        out = value if all(items[k] is v for k, v in value.items()) else items
    seen[id(value)] = (value, out)
    return out
