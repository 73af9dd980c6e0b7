"""Predict, for a plan and a world size, what every rank observes and how the run ends."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..plan import Plan, Step, flatten_layout, layout_shape, restrict_view
from ..plan.ops import COLLECTIVES
from .expect import Err, ModelRaise, Quirk
from .mesh import Call, Group, MeshModel, RankModel

SKIPPED = {"skipped": True}  # the step does not run on this rank
UNDEFINED = "undefined"  # torch's outcome is a race: any outcome is torch's
# Meshes torch accepts although it should refuse them; what follows derails.
_STATEFUL_FINDINGS = ("repeated-rank-accepted", "devicemesh-names-unchecked")
INJECTED = "MeshsimInjectedError"  # type of the exception a `raise` step throws


@dataclass
class RankPrediction:
    rank: int
    observations: list[Any] = field(default_factory=list)  # one per step
    end: str = "finished"  # finished | raised | died
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

    def expected(self, rank: int, step: int) -> Any:
        return self.ranks[rank].observations[step]


def predict(plan: Plan, world: int, deadline: float | None = None) -> Prediction:
    ranks = [_run_rank(plan, rank, world) for rank in range(world)]
    findings = set().union(*(r.findings for r in ranks)) if ranks else set()
    preds = [r.prediction for r in ranks]
    stuck, mismatched = simulate(preds)
    outcome = _outcome(preds, stuck, deadline)
    culprits = _culprits(plan, world, preds, stuck, outcome, deadline)
    prediction = Prediction(world, preds, outcome, stuck, mismatched, culprits, findings)
    deaths = [p.end_step for p in preds if p.end == "died"]
    if deaths:
        # Peers of a dead rank see whatever their transport reports (connection closed, timeouts).
        prediction.undefined_from = min(deaths)
    if mismatched:
        # Ranks passed different tensor sizes to one all_reduce. Right: every rank is told. gloo: some
        # ranks get wrong values silently, then they hang, or one aborts the process, depending on sizes.
        prediction.findings.add("gloo-size-mismatch-silent")
        prediction.undefined_from = min(call.step for call, _ in mismatched)
        prediction.undefined_finding = "gloo-size-mismatch-silent"
        prediction.outcome = Quirk("error", UNDEFINED, "gloo-size-mismatch-silent")
        return prediction
    derailed = [f for f in _STATEFUL_FINDINGS if f in findings]
    if derailed:
        # torch accepted a mesh it should have refused and derails: the right outcome is still a clean
        # pass; where torch ends up is a race.
        prediction.undefined_from = _first_step_of(preds, derailed[0])
        prediction.undefined_finding = derailed[0]
        prediction.outcome = Quirk("pass", UNDEFINED, derailed[0])
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


def _first_step_of(preds: list[RankPrediction], finding: str) -> int:
    steps = [i for p in preds for i, o in enumerate(p.observations)
             if isinstance(o, Quirk) and o.finding == finding]
    return min(steps, default=0)


def predict_rank(plan: Plan, world: int, rank: int) -> list[Any]:
    """One rank's predicted observations, without simulating the others (for very large worlds)."""
    return _run_rank(plan, rank, world).prediction.observations


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
    def __init__(self, plan: Plan, rank: int, world: int):
        self.model = RankModel(rank, world)
        self.prediction = RankPrediction(rank)
        self.handles: dict[str, Any] = {}
        self.plan = plan

    @property
    def findings(self) -> set[str]:
        return self.model.findings


def _run_rank(plan: Plan, rank: int, world: int) -> RankRun:
    run = RankRun(plan, rank, world)
    pred = run.prediction
    for index, st in enumerate(plan.steps):
        if pred.end != "finished":
            pred.observations.append(SKIPPED)
            continue
        if not st.runs_on(rank):
            pred.observations.append(SKIPPED)
            continue
        run.model.step = index
        pred.observations.append(observe_step(run, st, st.args_for(rank), index))
    pred.calls = run.model.calls
    return run


def observe_step(run: RankRun, st: Step, args: dict, index: int) -> Any:
    pred = run.prediction
    if st.op == "sleep":
        pred.slept += float(args["seconds"])
        return None
    if st.op == "raise":
        pred.end, pred.end_step = "raised", index
        return Err(INJECTED, args.get("message", ""))
    if st.op in ("exit", "kill"):
        pred.end, pred.end_step = "died", index
        return None
    try:
        value = _STEP[st.op](run, args)
    except ModelRaise as exc:
        if st.out:
            run.handles.pop(st.out, None)
        return exc.err
    if st.out is not None:
        run.handles[st.out] = value
    return _shape_result(run, st.op, value)


def _shape_result(run: RankRun, op: str, value: Any) -> Any:
    if isinstance(value, MeshModel):
        return summary(value)
    if isinstance(value, list) and value and isinstance(value[0], MeshModel):
        return [summary(m) for m in value]
    if op == "new_group":
        return None if value is None else {"ranks": list(value.ranks), "group_rank": value.group_rank(run.model.rank)}
    return value


def summary(mesh: MeshModel) -> Any:
    obs = {
        "shape": list(mesh.shape),
        "ndim": mesh.ndim,
        "names": list(mesh.names) if mesh.names else None,
        "coordinate": list(mesh.coordinate) if mesh.coordinate is not None else None,
        "mesh": mesh.view,
    }
    if mesh.creation_quirk is not None:
        return Quirk(mesh.creation_quirk.right, obs, mesh.creation_quirk.finding)
    return obs


def _resolve(run: RankRun, ref: str) -> Any:
    name, _, item = ref.partition(".")
    if name not in run.handles:
        raise ModelRaise(Err("HandleError", f"handle {name!r} does not exist on this rank"))
    value = run.handles[name]
    if item:
        if not isinstance(value, list) or int(item) >= len(value):
            raise ModelRaise(Err("HandleError", f"handle {ref!r} does not exist on this rank"))
        value = value[int(item)]
    return value


def _mesh(run: RankRun, ref: str) -> MeshModel:
    value = _resolve(run, ref)
    if not isinstance(value, MeshModel):
        raise ModelRaise(Err("HandleError", f"handle {ref!r} is not a mesh"))
    return value


def _init(run: RankRun, a: dict) -> MeshModel:
    return run.model.init_device_mesh(list(a["shape"]), a.get("names"))


def _explicit(run: RankRun, a: dict) -> MeshModel:
    return run.model.explicit(flatten_layout(a["layout"]), layout_shape(a["layout"]) or (), a.get("names"))


def _slice(run: RankRun, a: dict) -> MeshModel:
    return run.model.slice(_mesh(run, a["src"]), a["names"])


def _flatten(run: RankRun, a: dict) -> MeshModel:
    return run.model.flatten(_mesh(run, a["src"]), a.get("name"))


def _unflatten(run: RankRun, a: dict) -> MeshModel:
    return run.model.unflatten(_mesh(run, a["src"]), a["dim"], list(a["sizes"]), list(a["names"]))


def _concatenate(run: RankRun, a: dict) -> MeshModel:
    return run.model.concatenate([_mesh(run, ref) for ref in a["srcs"]])


def _from_group(run: RankRun, a: dict) -> MeshModel:
    model = run.model
    layout = a.get("layout")
    flat = flatten_layout(layout) if layout is not None else None
    shape = layout_shape(layout) if layout is not None else None
    if "group" in a:
        group = _resolve(run, a["group"])
        if group is None:
            raise ModelRaise(Err("TypeError", "not iterable"))
        return model.from_groups([group], flat, shape, a.get("names"), one_d=True)
    src = _mesh(run, a["src"])
    dims = a.get("dims") or list(range(src.ndim))
    groups = [model.get_group(src, d) for d in dims]
    names = a.get("names")
    if names is None and src.names:
        names = [src.names[d] if isinstance(d, int) else d for d in dims]
    if len(dims) > 1 and flat is None:
        if src.coordinate is None:
            raise ModelRaise(Err("HandleError", "this rank is not in the source mesh"))
        indices = [src.names.index(d) if isinstance(d, str) else d for d in dims]  # type: ignore[union-attr]
        flat, shape = restrict_view(model.mesh_view(src), src.coordinate, src.shape, indices)
    return model.from_groups(groups, flat, shape, names, one_d=len(dims) == 1)


def _all_submeshes(run: RankRun, a: dict) -> list[MeshModel]:
    return run.model.all_submeshes(_mesh(run, a["src"]), a["dim"])


def _new_group(run: RankRun, a: dict) -> Group | None:
    return run.model.new_group(list(a["ranks"]))


def _query(run: RankRun, a: dict) -> Any:
    model, mesh, dim, what = run.model, _mesh(run, a["mesh"]), a.get("dim"), a["what"]
    if what == "get_group":
        return model.group_observation(mesh, dim)
    if what == "get_all_groups":
        return [model.group_observation(mesh, i) for i in range(mesh.ndim)]
    if what == "get_local_rank":
        return model.local_rank_observation(mesh, dim)
    if what == "get_coordinate":
        return list(mesh.coordinate) if mesh.coordinate is not None else None
    if what == "size":
        return model.size(mesh, dim)
    if what == "shape":
        return list(mesh.shape)
    if what == "ndim":
        return mesh.ndim
    if what == "mesh":
        return model.mesh_view(mesh)
    return list(mesh.names) if mesh.names else None  # mesh_dim_names


def _attempt(fn, *args) -> Any:
    try:
        return fn(*args)
    except ModelRaise as exc:
        return exc.err


def _check(run: RankRun, a: dict) -> Any:
    model, mesh = run.model, _mesh(run, a["mesh"])
    collectives = a.get("collectives", True)
    obs = summary(mesh)
    if isinstance(obs, Quirk):
        obs = obs.torch
    obs = dict(obs, size=math.prod(mesh.shape), dims=[])
    for index in range(mesh.ndim):
        entry: dict[str, Any] = {"size": model.size(mesh, index)}
        try:
            group = model.get_group(mesh, index)
        except ModelRaise as exc:
            entry["group"] = exc.err
            obs["dims"].append(entry)
            continue
        entry["group"] = model.group_observation(mesh, index)
        entry["local_rank"] = model.local_rank_observation(mesh, index)
        if mesh.names:
            name = mesh.names[index]
            entry["group_by_name"] = _attempt(model.group_observation, mesh, name)
            entry["local_rank_by_name"] = _attempt(model.local_rank_observation, mesh, name)
        if collectives:
            entry["all_reduce"] = model.all_reduce(group, model.world)
            entry["all_gather"] = model.all_gather(group)
            entry["broadcast"] = model.broadcast(group, 0)
        obs["dims"].append(entry)
    obs["all_groups"] = _attempt(lambda: [model.group_observation(mesh, i) for i in range(mesh.ndim)])
    return obs


def _collective_group(run: RankRun, a: dict) -> Group | None:
    if "group" in a:
        return _resolve(run, a["group"])
    return run.model.get_group(_mesh(run, a["mesh"]), a.get("dim"))


def _collective(op: str):
    def step(run: RankRun, a: dict) -> Any:
        group = _collective_group(run, a)
        if group is None:  # not a member of a new_group: torch returns without communicating
            return None
        model = run.model
        if op == "all_reduce":
            return model.all_reduce(group, a.get("numel", model.world))
        if op == "all_gather":
            return model.all_gather(group)
        if op == "broadcast":
            return model.broadcast(group, a.get("src", 0))
        return model.barrier(group)

    return step


_STEP = {
    "init_device_mesh": _init,
    "mesh": _explicit,
    "slice": _slice,
    "flatten": _flatten,
    "unflatten": _unflatten,
    "concatenate": _concatenate,
    "from_group": _from_group,
    "all_submeshes": _all_submeshes,
    "new_group": _new_group,
    "query": _query,
    "check": _check,
    **{op: _collective(op) for op in COLLECTIVES},
}


# --------------------------------------------------------------------------------------------- the whole world


def simulate(preds: list[RankPrediction]) -> tuple[list[Stuck], list[tuple[Call, tuple[int, ...]]]]:
    """Run every rank's blocking calls against each other; return who is left waiting, and mismatches.

    A call completes when every member of its group is at the same call (same group, same position in
    that group's sequence, same op). Members of an all_reduce that disagree only on the tensor size
    complete it anyway (gloo does not check) and are reported as mismatched.
    """
    pos = [0] * len(preds)
    mismatched: list[tuple[Call, tuple[int, ...]]] = []

    def current(rank: int) -> Call | None:
        calls = preds[rank].calls
        return calls[pos[rank]] if pos[rank] < len(calls) else None

    progress = True
    while progress:
        progress = False
        for rank in range(len(preds)):
            call = current(rank)
            if call is None:
                continue
            at = [current(m) for m in call.members]
            if not all(c is not None and c.key == call.key and c.kind == call.kind for c in at):
                continue
            if call.kind != "all_reduce" and any(c.detail != call.detail for c in at):
                continue
            odd = tuple(m for m, c in zip(call.members, at) if c.detail != call.detail)
            if odd:
                mismatched.append((call, odd))
            for m in call.members:
                pos[m] += 1
            progress = True
    stuck = []
    for rank in range(len(preds)):
        call = current(rank)
        if call is not None:
            missing = tuple(m for m in call.members
                            if current(m) is None or (current(m).key, current(m).kind) != (call.key, call.kind))
            stuck.append(Stuck(rank, call, missing))
    return stuck, mismatched


def _outcome(preds: list[RankPrediction], stuck: list[Stuck], deadline: float | None) -> str:
    if any(p.end == "died" for p in preds):
        return "crash"
    if any(p.end == "raised" for p in preds):
        return "error"
    if stuck:
        return "hang"
    if deadline is not None and any(p.slept >= deadline for p in preds):
        return "hang"
    return "pass"





def _culprits(plan: Plan, world: int, preds: list[RankPrediction], stuck: list[Stuck], outcome: str,
              deadline: float | None) -> list[int]:
    if outcome == "pass":
        return []
    ended = {p.rank for p in preds if p.end != "finished"}
    if ended:
        return sorted(ended)
    if deadline is not None:
        late = {p.rank for p in preds if p.slept >= deadline}
        if late:
            return sorted(late)
    divergent = plan.divergent_ranks(world)
    if divergent:
        return sorted(divergent)
    return sorted({m for s in stuck for m in s.missing})
