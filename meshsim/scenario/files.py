"""Scenario files: a topology, a plan, a deadline, and what must happen. TOML, see scenarios/ and
docs/scenarios.md; which rules a file is read by is its `format` (meshsim.scenario.formats)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from ..core import deadlines
from ..core.errors import InputError
from ..core.outcome import KINDS, OUTCOMES, PASS, implied
from ..ops import validate
from ..spec.plan import Plan, PlanError
from ..spec.topology import Topology, TopologyError
from . import formats

DEFAULT_DEADLINE = deadlines.SCENARIO_S
MAX_FILE_BYTES = 1 << 20  # a scenario is a page of TOML, not a data file
EXPECT_KEYS = ("outcome", "culprit_ranks", "kind", "mesh_dim", "findings")
TOP_KEYS = (formats.KEY, "name", "description", "deadline", "topology", "step", "expect")


class ScenarioError(InputError):
    """A scenario file that cannot be run; the message names the file and the problem."""


@dataclass(frozen=True)
class Expect:
    outcome: str = PASS
    culprit_ranks: tuple[int, ...] | None = None
    kind: str | None = None
    mesh_dim: str | int | None = None
    findings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    topology: Topology
    plan: Plan
    deadline: float = DEFAULT_DEADLINE
    expect: Expect = field(default_factory=Expect)
    description: str = ""
    path: str = ""
    deadline_given: bool = True  # False: the file names none (DEFAULT_DEADLINE, grown for a larger tier: on_tier)
    format: int = formats.CURRENT  # the rules it is read by (meshsim.scenario.formats)

    def on_tier(self, tier: str) -> float:
        """The deadline to run this scenario with on a tier: its own, or the default grown with the tier and world."""
        return self.deadline if self.deadline_given else deadlines.plan(tier, self.topology.world, self.deadline)

    def to_toml(self) -> str:
        """The scenario in the current format, which it names first (whatever format it was read in: its plan and
        [expect] are the same in both, once read)."""
        data: dict[str, Any] = {formats.KEY: formats.CURRENT, "name": self.name}
        if self.description:
            data["description"] = self.description
        data["deadline"] = self.deadline
        data["topology"] = {"hosts": self.topology.hosts, "devices_per_host": self.topology.devices_per_host}
        data.update(self.plan.to_dict())
        data.pop("name", None)
        data["name"] = self.name
        expect: dict[str, Any] = {"outcome": self.expect.outcome}
        if self.expect.culprit_ranks is not None:
            expect["culprit_ranks"] = list(self.expect.culprit_ranks)
        for key in ("kind", "mesh_dim"):
            if getattr(self.expect, key) is not None:
                expect[key] = getattr(self.expect, key)
        if self.expect.findings:
            expect["findings"] = list(self.expect.findings)
        data["expect"] = expect
        return tomli_w.dumps(data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_toml())
        return path


def load(path: str | Path, deadline: float | None = None) -> Scenario:
    """Read and validate a scenario file; ScenarioError names the file and the problem."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ScenarioError(f"{path}: larger than {MAX_FILE_BYTES} bytes; a scenario is a page of TOML")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text, so not a TOML scenario") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: TOML syntax: {exc}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: TOML nested too deeply") from None
    try:
        return parse(data, str(path), deadline)
    except (PlanError, TopologyError, ScenarioError, deadlines.DeadlineError, formats.FormatError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def parse(data: dict, path: str = "", deadline: float | None = None) -> Scenario:
    """A scenario from its TOML table, read by the rules of the format it names (a deadline given here is taken
    as it is: it is this meshsim's option, not the file's)."""
    unknown = set(data) - set(TOP_KEYS)
    if unknown:
        raise ScenarioError(f"unknown key {sorted(unknown)[0]!r} (a scenario has {', '.join(TOP_KEYS)})")
    form = formats.of(data)
    if form == formats.LEGACY and deadline is None and "deadline" in data:
        own, factor = formats.legacy_deadline(data["deadline"])
        data = {**data, "deadline": own, "step": formats.stretch_sleeps(data.get("step"), factor)}
    topo = data.get("topology")
    if not isinstance(topo, dict) or set(topo) - {"hosts", "devices_per_host"}:
        raise ScenarioError("needs [topology] with hosts and devices_per_host")
    topology = Topology(topo.get("hosts"), topo.get("devices_per_host"))  # type: ignore[arg-type]  # it checks
    plan = validate(Plan.from_dict(data), topology.world)
    wait = deadlines.checked(data.get("deadline", DEFAULT_DEADLINE) if deadline is None else deadline)
    expect = _expect(data.get("expect", {}), topology.world)
    for key in ("name", "description"):
        if not isinstance(data.get(key, ""), str):
            raise ScenarioError(f"{key} must be a string, got {data[key]!r}")
    name = data.get("name") or Path(path).stem or "scenario"
    return Scenario(name, topology, plan, wait, expect, data.get("description", ""), path,
                    deadline_given=deadline is not None or "deadline" in data, format=form)


def _expect(raw: Any, world: int) -> Expect:
    if not isinstance(raw, dict):
        raise ScenarioError("[expect] must be a table")
    unknown = set(raw) - set(EXPECT_KEYS)
    if unknown:
        raise ScenarioError(f"[expect] has unknown key {sorted(unknown)[0]!r}; known: {', '.join(EXPECT_KEYS)}")
    outcome = raw.get("outcome", PASS)
    if outcome not in OUTCOMES:
        raise ScenarioError(f"[expect] outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
    culprits = raw.get("culprit_ranks")
    if culprits is not None:
        if not isinstance(culprits, list) or not all(type(r) is int and 0 <= r < world for r in culprits):
            raise ScenarioError(f"[expect] culprit_ranks must be a list of ranks of the world (0..{world - 1}), "
                                f"got {culprits!r}")
        culprits = tuple(sorted(culprits))
    findings = raw.get("findings", [])
    from ..model import findings as F

    if not isinstance(findings, list) or not all(isinstance(f, str) for f in findings):
        raise ScenarioError(f"[expect] findings must be a list of finding ids, got {findings!r}")
    for fid in findings:
        if fid not in F.REGISTRY:
            raise ScenarioError(f"[expect] unknown finding {fid!r}; see `meshsim findings`")
    kind = raw.get("kind")
    if kind is not None and kind not in KINDS.values():
        raise ScenarioError(f"[expect] kind must be one of {', '.join(KINDS.values())}, got {kind!r}")
    if kind is not None and implied(kind) not in (None, outcome):
        raise ScenarioError(f"[expect] kind {kind!r} is a run that ends as {implied(kind)!r}, but outcome is "
                            f"{outcome!r}")
    mesh_dim = raw.get("mesh_dim")
    if mesh_dim is not None and not (isinstance(mesh_dim, str) or type(mesh_dim) is int):
        raise ScenarioError(f"[expect] mesh_dim must be a dim name or index, got {mesh_dim!r}")
    return Expect(outcome, culprits, kind, mesh_dim, tuple(findings))


@dataclass
class ScenarioRun:
    scenario: Scenario
    result: Any
    problems: list[str]
    notes: list[str] = field(default_factory=list)  # what the report says besides: an older format's update hint

    @property
    def matched(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        out = {"scenario": self.scenario.name, "file": self.scenario.path, "format": self.scenario.format,
               "matched": self.matched, "problems": self.problems, "notes": self.notes,
               "expected_outcome": self.scenario.expect.outcome}
        out.update(self.result.to_json())
        return out


def judge_scenario(scenario: Scenario, result: Any) -> ScenarioRun:
    """Does the run end as the scenario says it must, read by the rules of its format?"""
    expect, problems = scenario.expect, []
    if result.outcome != expect.outcome:
        problems.append(f"outcome {result.outcome}, expected {expect.outcome}")
    if expect.outcome == PASS and result.outcome == PASS and not result.passed:
        problems.append("ranks observed something other than the model predicts")
    diagnosis = result.diagnosis
    if expect.culprit_ranks is not None and result.outcome == expect.outcome:
        if tuple(result.culprits) != expect.culprit_ranks:
            problems.append(f"culprit ranks {list(result.culprits)}, expected {list(expect.culprit_ranks)}")
    if expect.kind is not None and diagnosis is not None and \
            not formats.kind_matches(expect.kind, diagnosis.kind, scenario.format):
        problems.append(f"diagnosis kind {diagnosis.kind!r}, expected {expect.kind!r}")
    if expect.mesh_dim is not None and diagnosis is not None:
        dims = {w.mesh_dim for w in diagnosis.waits}
        if expect.mesh_dim not in dims:
            problems.append(f"no waiting rank names mesh dim {expect.mesh_dim!r} (saw {sorted(map(str, dims))})")
    for fid in expect.findings:
        if fid not in result.findings:
            problems.append(f"finding {fid} was expected and not seen")
    # A step that raises where the file does not say it means it to is most often a typo, and it would make the
    # scenario pass for the wrong reason: it is a problem on its own, not only an explanation of another. In
    # format 1 (0.2's rules) a step that raises where torch and the model agree is fine: it only explains.
    if scenario.format != formats.LEGACY or problems:
        problems.extend(_unmeant_errors(scenario, result))
    notes = [formats.hint(scenario.path, scenario.format)] if scenario.format != formats.CURRENT else []
    return ScenarioRun(scenario, result, problems, notes)


def _unmeant_errors(scenario: Scenario, result: Any) -> list[str]:
    """Steps that raise on some rank although the file does not say it means them to (expect_error): in a
    hand-written scenario that is most often a typo (a misspelt dim name, a handle), and it explains why the run
    ended otherwise than expected."""
    from ..core.ranks import ranks_text
    from ..ops import operation_of

    prediction = result.prediction
    if prediction is None or prediction.model_error is not None:
        return []
    out = []
    for index, (error, ranks) in raising_steps(scenario.plan, prediction, scenario.topology.world).items():
        st = scenario.plan.steps[index]
        if st.expect_error or operation_of(st).role == "fault":  # a fault step raises by definition
            continue
        out.append(f"step {index} ({st.op}) raises {error!r} on ranks {ranks_text(ranks)}, and the file does "
                   "not say it means that (expect_error = true): a misspelt name or handle?")
    return out


def raising_steps(plan: Any, prediction: Any, world: int) -> dict[int, tuple[str, list[int]]]:
    """The steps the model says raise, as torch and as is right alike (a Quirk's error is its finding's): the
    first error of each, and the ranks it raises on."""
    from ..core.wire import is_error
    from ..model import torch_side
    from ..model.expect import Quirk

    out: dict[int, tuple[str, list[int]]] = {}
    for index in range(len(plan.steps)):
        raised: dict[str, list[int]] = {}
        for rank in range(world):
            expected = prediction.expected(rank, index)
            if isinstance(expected, Quirk):
                continue
            value = _as_json(torch_side(expected))
            if is_error(value):
                raised.setdefault(f"{value['error'][0]}: {value['error'][1]}", []).append(rank)
        if raised:
            out[index] = next(iter(raised.items()))
    return out


def _as_json(value: Any) -> Any:
    from ..model import to_json

    return to_json(value)
