"""The one judge: what every rank observed against what the model predicts, how the run ended, and who is to blame.

Every kind of run ends in a record (meshsim.core.record); `judge` turns it into a Verdict, the one result type that
the CLI, the Python API, pytest, nightly and replay report.
"""

from __future__ import annotations

import functools
from array import array
from dataclasses import dataclass, field
from typing import Any

from ..core.outcome import CRASH, ERROR, HANG, PASS, SLOW, UNDEFINED, outcome_of
from ..core.record import RankState, RunRecord
from ..core.wire import (
    DIED,
    DTENSOR_CALL,
    FINISHED,
    NOT_SIMULATED,
    SKIPPED,
    STUCK,
    UNMOVED,
    digest_ints,
    is_digest,
    is_error,
)
from ..model import Err, Quirk, to_json
from ..model import findings as F
from ..model.expect import UNPREDICTED, Grid
from ..model.predict import Prediction
from ..spec.fields import flatten_layout
from ..spec.plan import Plan
from ..spec.topology import Topology
from .diagnose import Diagnosis, diagnose


@functools.lru_cache(maxsize=1)
def torch_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "0"


@dataclass
class Difference:
    """One thing that differs from the model, on some ranks, at one step."""

    step: int
    op: str
    handle: str | None
    path: str  # where in the step's observation ("" = the whole value)
    rows: list[tuple[list[int], Any, Any]]  # (ranks, expected, observed), identical values merged

    @property
    def ranks(self) -> list[int]:
        return sorted(r for rows, _, _ in self.rows for r in rows)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "op": self.op, "handle": self.handle, "path": self.path,
                "ranks": self.ranks,
                "rows": [{"ranks": r, "expected": to_json(e), "observed": o} for r, e, o in self.rows]}


@dataclass
class FindingHit:
    finding: str
    where: list[str] = field(default_factory=list)  # "step 3 dims[0].local_rank"
    ranks: set[int] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        f = F.get(self.finding)
        return {"id": self.finding, "title": f.title, "kind": f.kind, "where": self.where[:10],
                "ranks": sorted(self.ranks)}


@dataclass
class RankResult:
    """What a user function did on one rank: its value, or the error it raised (with its traceback)."""

    rank: int
    ok: bool
    value: Any = None
    error: BaseException | str | None = None  # the exception (or its repr if it did not pickle)
    traceback: str = ""


@dataclass
class Verdict:
    """How a run ended, judged: one type for every kind of work (a plan, a user function, a script, a replay).

    outcome: what happened (meshsim.core.outcome); expected: what the model says should (a plan's prediction; a
    function, a script and a replay are expected to pass); the differences from the model and the findings they
    touched; the diagnosis when the run did not finish cleanly; and the record it was judged from.
    """

    work: str  # plan | function | script | replay
    world: int
    outcome: str
    expected: Any
    record: RunRecord
    differences: list[Difference] = field(default_factory=list)
    findings: dict[str, FindingHit] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None
    plan: Plan | None = None
    prediction: Prediction | None = None
    strict: bool = False
    unseen_hang: bool = False  # the model predicts a hang the tier cannot show (fake: nothing waits)
    script: str = ""  # the script a launch ran
    topology: Topology | None = None  # hosts x devices, where the work ran on a topology (hosts of each group)
    attempts: list[Verdict] = field(default_factory=list)  # a launch's earlier attempts, each failed and restarted

    @property
    def notes(self) -> list[str]:
        """What the tier that ran this could not check (meshsim.core.record.RunRecord.notes)."""
        return list(self.record.notes)

    @property
    def outcome_as_expected(self) -> bool:
        return self.unseen_hang or _outcome_ok(self.expected, self.outcome)

    @property
    def passed(self) -> bool:
        """The run agrees with the model (findings allowed unless strict); for work without a model: every rank
        finished."""
        if self.strict and self.findings:
            return False
        return self.outcome_as_expected and not self.differences

    @property
    def culprits(self) -> list[int]:
        return list(self.diagnosis.culprits) if self.diagnosis is not None else []

    @property
    def elapsed(self) -> float:
        return self.record.elapsed

    # ------------------------------------------------------------------ what a function or a script left

    @property
    def results(self) -> list[RankResult]:
        """A user function's result on every rank (values unpickled on first use)."""
        cached = self.__dict__.get("_results")
        if cached is None:
            cached = self.__dict__["_results"] = [_rank_result(s) for s in self.record.states]
        return cached

    @property
    def values(self) -> list[Any]:
        """Each rank's return value; raises Failed (with the whole report) if the run did not pass."""
        self.raise_for_outcome()
        return [r.value for r in self.results]

    @property
    def failed_ranks(self) -> list[int]:
        if self.work == "function":
            return [r.rank for r in self.results if not r.ok]
        return sorted(set(self.record.died) | set(self.record.raised))

    @property
    def exit_codes(self) -> list[int | None]:
        """A script's exit code on every rank (None: it never finished)."""
        return [s.value.exit_code if s.value is not None else s.exitcode if s.end == DIED else None
                for s in self.record.states]

    @property
    def tracebacks(self) -> list[str]:
        return [s.value.traceback if s.value is not None else "" for s in self.record.states]

    @property
    def outputs(self) -> list[str]:
        return [s.output for s in self.record.states]

    @property
    def output(self) -> str:
        """What every rank printed during the run, each line prefixed with its rank ("[rank3]: ...")."""
        return rank_output(self.record.states)

    # ------------------------------------------------------------------ reporting

    def raise_for_outcome(self) -> Verdict:
        """Raise Failed (an AssertionError whose message is the whole report: differences, findings, the hang
        diagnosis with stacks, errors with tracebacks, and every rank's output) unless the run passed."""
        if not self.passed:
            raise Failed(self)
        return self

    def report(self) -> str:
        """The whole story, as text."""
        from .report import verdict_text

        return verdict_text(self)

    def summary(self) -> str:
        from .report import verdict_summary

        return verdict_summary(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "work": self.work,
            "outcome": self.outcome,
            "expected_outcome": to_json(self.expected),
            "passed": self.passed,
            "world": self.world,
            "elapsed_s": round(self.record.elapsed, 3),
            "culprit_ranks": self.culprits,
            "differences": [d.to_json() for d in self.differences],
            "findings": [h.to_json() for h in self.findings.values()],
            "diagnosis": self.diagnosis.to_json() if self.diagnosis is not None else None,
            "restarts": [{"outcome": a.outcome, "exit_codes": a.exit_codes} for a in self.attempts],
        }


class Failed(AssertionError):
    """A run that did not pass; the message is the whole report, and .verdict the verdict."""

    def __init__(self, verdict: Verdict):
        super().__init__("\n" + verdict.report())
        self.verdict = verdict

    @property
    def result(self) -> Verdict:
        return self.verdict


def rank_output(states: list[RankState]) -> str:
    return "".join(f"[rank{s.rank}]: {line}\n" for s in states for line in s.output.splitlines())


def _rank_result(state: RankState) -> RankResult:
    if state.value is None:
        where = state.where if state.end != STUCK else f"stuck: {state.where}"
        return RankResult(state.rank, False, error=where)
    ok, blob = state.end == FINISHED, state.value
    try:
        import dill

        value = dill.loads(blob) if isinstance(blob, bytes) else blob
    except Exception as exc:  # a result that cannot be rebuilt here is still worth showing
        value = f"<unpicklable: {exc}>"
    if ok:
        return RankResult(state.rank, True, value)
    if isinstance(value, tuple) and len(value) == 2:
        return RankResult(state.rank, False, error=value[0], traceback=value[1])
    return RankResult(state.rank, False, error=str(value))


def _outcome_ok(expected: Any, outcome: str) -> bool:
    if isinstance(expected, Quirk):
        torch_ok = outcome == expected.torch or expected.torch == UNDEFINED
        return outcome == expected.right or (torch_ok and bool(F.applies(expected.finding, torch_version())))
    return bool(outcome == expected)


def judge(record: RunRecord, work: str = "plan", plan: Plan | None = None, prediction: Prediction | None = None,
          strict: bool = False, script: str = "", topology: Topology | None = None) -> Verdict:
    """The one judge: a record (of any executor, any work) against the model where there is a plan; one rule for
    the outcome (meshsim.core.outcome) and one for culprits (meshsim.judge.blame)."""
    differences, hits = _against_model(plan, prediction, record)
    if record.classes is not None:  # a class's representative stands for every rank of its class
        for hit in hits.values():
            hit.ranks = set(record.classes.expand(hit.ranks))
        for difference in differences:
            difference.rows = [(record.classes.expand(ranks), e, o) for ranks, e, o in difference.rows]
    outcome = outcome_of((s.end for s in record.states), record.timed_out, bool(differences), record.still_moving)
    expected = prediction.outcome if prediction is not None else PASS
    verdict = Verdict(work, record.world, outcome, expected, record, differences, hits, plan=plan,
                      prediction=prediction, strict=strict, script=script, topology=topology)
    if prediction is not None:
        verdict.unseen_hang = _unseen_hang(record, expected, outcome)
        if isinstance(expected, Quirk) and outcome != expected.right and expected.torch in (outcome, UNDEFINED):
            hit = hits.setdefault(expected.finding, FindingHit(expected.finding))
            hit.where.append(f"outcome {outcome}")
    if outcome in (HANG, CRASH, ERROR, SLOW):
        verdict.diagnosis = diagnose(record, plan, prediction)
    return verdict


def _against_model(plan: Plan | None, prediction: Prediction | None, record: RunRecord
                   ) -> tuple[list[Difference], dict[str, FindingHit]]:
    if plan is None or prediction is None:
        return [], {}
    if prediction.model_error is not None:
        at = prediction.model_error_step or 0
        return [Difference(at, plan.steps[at].op, None, "(the model)",
                           [(list(range(record.world)), prediction.model_error, "not compared")])], {}
    return compare_run(plan, prediction, record, torch_version())


def _unseen_hang(record: RunRecord, expected: Any, outcome: str) -> bool:
    """Nothing waits on the fake tier: a hang the model predicts cannot show. Say so; judge the rest."""
    if record.moves_data or HANG not in (expected, getattr(expected, "right", None), getattr(expected, "torch", None)):
        return False
    record.notes.append("the model predicts a hang, which the fake tier cannot show: run this plan on the "
                        "thread or process tier to see it")
    return outcome == PASS


def compare_run(plan: Plan, prediction: Prediction, record: RunRecord, version: str
                ) -> tuple[list[Difference], dict[str, FindingHit]]:
    grouped: dict[tuple[int, str], dict[tuple[str, str], tuple[list[int], Any, Any]]] = {}
    hits: dict[str, FindingHit] = {}
    racy_from = prediction.undefined_from
    if prediction.undefined_finding is not None and not F.applies(prediction.undefined_finding, version):
        racy_from = None
    for state in record.states:
        if state.observations is None:
            continue
        for index, observed in enumerate(state.observations):
            expected = prediction.expected(state.rank, index)
            if isinstance(observed, dict) and "comms" in observed:  # the fake tier counted a DTensor step's
                expected = with_comms(expected, predicted_comms(prediction, state.rank, index))
            elif isinstance(observed, dict) and (issued := issued_comms(record, plan, state, index, version)):
                # the process tier's record counts the calls it saw: each kind it saw, against the model's count
                predicted = predicted_comms(prediction, state.rank, index)
                observed = with_comms(observed, issued)
                expected = with_comms(expected, {k: n for k, n in predicted.items() if k in issued})
            for kind, path, exp, obs, finding in compare(expected, observed, "", version):
                if kind == "diff" and racy_from is not None and index >= racy_from:
                    if prediction.undefined_finding is None:
                        continue  # a consequence of a rank's death, not torch's doing
                    kind, finding = "finding", prediction.undefined_finding
                if kind == "finding":
                    hit = hits.setdefault(finding, FindingHit(finding))
                    label = f"step {index} {path}".strip()
                    if label not in hit.where:
                        hit.where.append(label)
                    hit.ranks.add(state.rank)
                    continue
                rows = grouped.setdefault((index, path), {})
                key = (repr(to_json(exp)), repr(obs))
                rows.setdefault(key, ([], exp, obs))[0].append(state.rank)
    differences = []
    for (index, path), rows in sorted(grouped.items()):
        st = plan.steps[index]
        differences.append(Difference(index, st.op, st.out or st.args.get("mesh") or st.args.get("src"), path,
                                      list(rows.values())))
    return differences, hits


def predicted_comms(prediction: Prediction, rank: int, step: int) -> dict[str, int]:
    """The collectives the model says a rank's DTensor step issues, counted by name as torch's CommDebugMode counts
    them."""
    found: dict[str, int] = {}
    for call in prediction.ranks[rank].calls:
        if call.step == step and call.kind.startswith(DTENSOR_CALL + " ") and call.detail:
            found[str(call.detail[0])] = found.get(str(call.detail[0]), 0) + 1
    return dict(sorted(found.items()))


# The collectives a rank's record names (meshsim.compat.follow: functional collectives by their Python names, which
# vary by release; c10d's by theirs), by the op names torch's CommDebugMode counts
COMM_OPS = {"all_gather_single": "all_gather_into_tensor", "all_gather_tensor": "all_gather_into_tensor",
            "all_gather_tensor_autograd": "all_gather_into_tensor", "all_gather_into_tensor": "all_gather_into_tensor",
            "reduce_scatter_single": "reduce_scatter_tensor", "reduce_scatter_tensor": "reduce_scatter_tensor",
            "reduce_scatter_tensor_autograd": "reduce_scatter_tensor", "all_reduce": "all_reduce",
            "all_to_all_single": "all_to_all_single", "all_to_all_single_autograd": "all_to_all_single",
            "broadcast": "broadcast_", "scatter": "scatter_"}
# DTensor steps whose collectives the record counts: distribute_tensor's scatter and broadcast go through names
# DTensor bound at import, which no follower sees
COUNTED_STEPS = ("redistribute", "full_tensor")


def issued_comms(record: RunRecord, plan: Plan, state: RankState, index: int, version: str
                 ) -> dict[str, int] | None:
    """The collectives a rank's DTensor step issued, as the process tier's record shows them (every call a rank
    makes is followed), by CommDebugMode's names; None where the record cannot say: another tier, NCCL (whose
    DTensor takes other paths than the CPU group's the model knows), a release whose counts the model does not
    know (semantics rule redistribute-comms), a step that is not counted, a call of another name, or none at all."""
    if record.tier != "process" or record.backend != "gloo" or index >= len(plan.steps) or \
            plan.steps[index].op not in COUNTED_STEPS or not _counts_known(version):
        return None
    found: dict[str, int] = {}
    for site, kind in state.call_log.values():
        if site == index:
            if kind not in COMM_OPS:
                return None
            found[COMM_OPS[kind]] = found.get(COMM_OPS[kind], 0) + 1
    # torch may also call a collective by a name no follower sees (an uneven Shard -> Shard on a size-1 dim issues
    # one the record does not show): the kinds seen are compared, and a step with none is not
    return dict(sorted(found.items())) if found else None


@functools.lru_cache(maxsize=8)
def _counts_known(version: str) -> bool:
    from ..core.releases import parse
    from ..model.semantics import holds

    try:
        return holds("redistribute-comms", parse(version))
    except ValueError:
        return False


def with_comms(expected: Any, comms: dict[str, int] | None) -> Any:
    """An expected DTensor observation with the collectives it should have issued (an observation with those it
    issued)."""
    if comms is None:
        return expected
    if isinstance(expected, Quirk):
        return Quirk(with_comms(expected.right, comms), with_comms(expected.torch, comms), expected.finding)
    if isinstance(expected, dict) and not is_error(expected):
        return dict(expected, comms=comms)
    return expected


_digests: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(expected view) -> (view, digest): views are shared by ranks


def digest_of(expected: Any) -> dict[str, Any]:
    """The model's view digested as the fake tier digests torch's (meshsim.core.wire.digest_ints)."""
    hit = _digests.get(id(expected))
    if hit is not None and hit[0] is expected:
        return hit[1]
    shape, level = [], expected
    while isinstance(level, list):
        shape.append(len(level))
        level = level[0] if level else None
    digest = digest_ints(array("q", flatten_layout(expected)).tobytes(), shape)
    if len(_digests) > 256:
        _digests.clear()
    _digests[id(expected)] = (expected, digest)
    return digest


def compare(expected: Any, observed: Any, path: str, version: str) -> list[tuple[Any, ...]]:
    """Differences between one expectation and one observation: (kind, path, expected, observed, finding)."""
    if expected is observed or observed == UNMOVED or expected == NOT_SIMULATED:
        return []  # the fake tier's collectives and values, and what the model does not predict: nothing to compare
    if (type(expected) in (list, dict) or type(expected) is Grid) and expected == observed:
        return []  # equal plain data holds no Quirk or Err (they never equal JSON values): nothing to explain
    if is_digest(observed) and isinstance(expected, list):
        digest = digest_of(expected)
        return [] if digest == observed else [("diff", path, digest, observed, None)]
    if isinstance(expected, Quirk) and expected.torch == UNPREDICTED:
        if not _diffs(compare(expected.right, observed, path, version)):
            return []
        if F.applies(expected.finding, version):
            return [("finding", path, expected.right, observed, expected.finding)]
        return [("diff", path, expected.right, observed, None)]
    if isinstance(expected, Quirk):
        if F.applies(expected.finding, version) and not _diffs(compare(expected.torch, observed, path, version)):
            return [("finding", path, expected.right, observed, expected.finding)]
        if not _diffs(compare(expected.right, observed, path, version)):
            return []  # torch does what is right here: the finding does not apply to this version
        return [("diff", path, expected.right, observed, None)]
    if isinstance(expected, Err):
        return [] if expected.matches(observed) else [("diff", path, expected, observed, None)]
    if expected is SKIPPED or observed == SKIPPED:
        return [] if expected == observed else [("diff", path, expected, observed, None)]
    if isinstance(expected, dict):
        if not isinstance(observed, dict) or is_error(observed):
            return [("diff", path, expected, observed, None)]
        out = []
        for key in sorted(set(expected) | set(observed), key=str):
            sub = f"{path}.{key}" if path else key
            if key not in observed or key not in expected:
                out.append(("diff", sub, expected.get(key, "<absent>"), observed.get(key, "<absent>"), None))
            else:
                out.extend(compare(expected[key], observed[key], sub, version))
        return out
    if isinstance(expected, list):
        if not isinstance(observed, list) or len(observed) != len(expected):
            return [("diff", path, expected, observed, None)]
        out = []
        for i, (e, o) in enumerate(zip(expected, observed)):
            out.extend(compare(e, o, f"{path}[{i}]", version))
        return _collapse_list(out, path, expected, observed)
    if expected == observed and isinstance(expected, bool) == isinstance(observed, bool):
        return []
    return [("diff", path, expected, observed, None)]


def _collapse_list(out: list[tuple[Any, ...]], path: str, expected: list[Any], observed: list[Any]
                   ) -> list[tuple[Any, ...]]:
    """A list that differs in its elements reads better as one difference of the whole list."""
    if any(kind == "diff" for kind, *_ in out) and all(not isinstance(e, (dict, Quirk)) for e in expected):
        return [t for t in out if t[0] == "finding"] + [("diff", path, expected, observed, None)]
    return out


def _diffs(items: list[tuple[Any, ...]]) -> bool:
    return any(kind == "diff" for kind, *_ in items)
