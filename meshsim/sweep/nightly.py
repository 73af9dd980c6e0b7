"""`meshsim nightly`: the standard suite, one report (text, JSON, JUnit XML).

The suite: every scenario that should pass, a seeded fuzz budget, and (on gloo) the DeviceMesh recipe's
examples. Run locally it uses a simulated cluster; under torchrun (meshsim.torchrun) the same plans run
on the ranks torchrun started.
"""

from __future__ import annotations

import datetime
import glob
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.outcome import PASS
from ..scenario.files import Scenario, load


@dataclass
class Item:
    """One test case of the nightly report."""

    suite: str  # scenario | fuzz | example
    name: str
    passed: bool
    seconds: float
    detail: str = ""
    data: dict = field(default_factory=dict)
    skipped: str | None = None  # why this part of the suite did not run

    def to_json(self) -> dict:
        return {"suite": self.suite, "name": self.name, "passed": self.passed, "seconds": round(self.seconds, 3),
                "detail": self.detail, "skipped": self.skipped, **self.data}


def skipped(suite: str, reason: str) -> Item:
    """A part of the suite that did not run: a line in the report and a JUnit <skipped>, never silence."""
    return Item(suite, f"{suite} (skipped)", True, 0.0, reason, skipped=reason)


@dataclass
class NightlyReport:
    topology: str
    backend: str
    seed: int
    items: list[Item] = field(default_factory=list)
    mode: str = "local"  # local | torchrun
    started: str = field(default_factory=lambda: datetime.datetime.now().isoformat(timespec="seconds"))

    @property
    def passed(self) -> bool:
        return all(item.passed for item in self.items)

    def to_json(self) -> dict:
        return {"topology": self.topology, "backend": self.backend, "mode": self.mode, "seed": self.seed,
                "started": self.started, "passed": self.passed,
                "failures": sum(not i.passed for i in self.items), "items": [i.to_json() for i in self.items]}

    def to_junit(self) -> str:
        suites = ET.Element("testsuites", name="meshsim nightly")
        for suite_name in dict.fromkeys(i.suite for i in self.items):
            items = [i for i in self.items if i.suite == suite_name]
            suite = ET.SubElement(suites, "testsuite", name=f"meshsim.{suite_name}", tests=str(len(items)),
                                  failures=str(sum(not i.passed for i in items)), errors="0",
                                  time=f"{sum(i.seconds for i in items):.3f}", timestamp=self.started)
            props = ET.SubElement(suite, "properties")
            for key, value in (("topology", self.topology), ("backend", self.backend), ("seed", str(self.seed)),
                               ("mode", self.mode)):
                ET.SubElement(props, "property", name=key, value=value)
            for item in items:
                case = ET.SubElement(suite, "testcase", classname=f"meshsim.{suite_name}", name=item.name,
                                     time=f"{item.seconds:.3f}")
                if item.skipped is not None:
                    ET.SubElement(case, "skipped", message=item.skipped)
                elif not item.passed:
                    failure = ET.SubElement(case, "failure", message=item.detail.splitlines()[0][:500] if item.detail
                                            else "failed")
                    failure.text = item.detail
                elif item.detail:
                    ET.SubElement(case, "system-out").text = item.detail
        ET.indent(suites)
        return ET.tostring(suites, encoding="unicode", xml_declaration=True)


def default_seed() -> int:
    """Tonight's date: each night explores new plans, and any night can be replayed by its seed."""
    return int(datetime.date.today().strftime("%Y%m%d"))


def passing_scenarios(directory: str | Path, world: int | None = None) -> list[Scenario]:
    """The scenarios in `directory` that expect to pass (on this world size, when given)."""
    found = []
    for path in sorted(glob.glob(os.path.join(str(directory), "*.toml"))):
        scenario = load(path)
        if scenario.expect.outcome == PASS and (world is None or scenario.topology.world == world):
            found.append(scenario)
    return found


def scenario_item(scenario: Scenario, result: Any) -> Item:
    from ..scenario.files import judge_scenario
    from .properties import render_text

    run = judge_scenario(scenario, result)
    detail = "; ".join(run.problems) if run.problems else f"{result.outcome}"
    if run.problems:
        detail += "\n" + render_text(result)
    detail += "".join(f"\nnote: {note}" for note in run.notes)
    findings = sorted(result.findings)
    return Item("scenario", scenario.name, run.matched, result.record.elapsed, detail,
                {"outcome": result.outcome, "findings": findings,
                 "diagnosis": result.diagnosis.to_json() if result.diagnosis is not None else None})


def fuzz_item(report: Any, seed: int) -> Item:
    from .properties import render_text

    name = f"fuzz seed {seed} ({report.examples} plans)"
    if report.passed:
        detail = (f"{report.examples} plans, {report.rate:.1f}/s, outcomes {dict(report.outcomes)}, "
                  f"findings {dict(report.findings)}")
        return Item("fuzz", name, True, report.elapsed, detail, report.to_json())
    detail = (f"torch disagrees with the model; minimal plan saved as {report.saved}\n"
              + render_text(report.failure))
    return Item("fuzz", name, False, report.elapsed, detail, report.to_json())


def suite_scenarios(scenarios_dir: str | None, world: int) -> tuple[list[Scenario], Item | None]:
    """The passing scenarios for this world, or why there are none (a skipped item)."""
    if not scenarios_dir:
        return [], skipped("scenario", "no scenario directory given")
    if not os.path.isdir(scenarios_dir):
        return [], skipped("scenario", f"no scenario directory {scenarios_dir}")
    found = passing_scenarios(scenarios_dir, world)
    if not found:
        return [], skipped("scenario", f"no scenario in {scenarios_dir} expects to pass on {world} ranks")
    return found, None


def check_scenarios_dir(path: str) -> None:
    """A scenario directory named explicitly must exist and hold scenarios (exit 2 otherwise)."""
    if not os.path.isdir(path):
        raise ValueError(f"--scenarios {path}: no such directory")
    if not glob.glob(os.path.join(path, "*.toml")):
        raise ValueError(f"--scenarios {path}: holds no *.toml scenario")
    for scenario_path in sorted(glob.glob(os.path.join(path, "*.toml"))):
        load(scenario_path)  # every file valid before anything starts


def run_local(topology: Any, backend: str, scenarios_dir: str | None, examples: int, seed: int, deadline: float,
              save_dir: str, with_examples: bool = True, setup: Any = None) -> NightlyReport:
    from ..cluster import Cluster
    from .loop import fuzz

    scenarios, missing = suite_scenarios(scenarios_dir, topology.world)
    with Cluster(topology, backend=backend, deadline=deadline, setup=setup) as cluster:
        report = NightlyReport(str(topology), cluster.backend, seed)
        report.items.extend([missing] if missing else [])
        from ..judge.report import progress_bar

        with progress_bar("nightly scenarios", len(scenarios), disable=not scenarios) as step:
            for scenario in scenarios:
                report.items.append(scenario_item(scenario, cluster.run(scenario.plan, deadline=scenario.deadline)))
                step(scenario.name)
        if examples:
            result = fuzz(cluster, examples, seed=seed, deadline=deadline, save_dir=save_dir)
            report.items.append(fuzz_item(result, seed))
        else:
            report.items.append(skipped("fuzz", "--examples 0"))
        if not with_examples:
            report.items.append(skipped("example", "--no-examples"))
        elif cluster.backend != "gloo" or topology.world != 8:
            report.items.append(skipped("example", "the recipe's examples are written for a 2x4 gloo cluster; "
                                                   f"this one is {topology} {cluster.backend}"))
        else:
            from ..examples import run_examples

            for ex in run_examples(cluster):
                report.items.append(Item("example", ex.name, ex.passed, ex.seconds, ex.detail, ex.facts))
    return report


def write_outputs(report: NightlyReport, json_path: str | None, junit_path: str | None) -> None:
    import json

    for path, text in ((json_path, lambda: json.dumps(report.to_json(), indent=2)), (junit_path, report.to_junit)):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text())


def render(report: NightlyReport, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"meshsim nightly — {report.topology} {report.backend} ({report.mode}), seed {report.seed}")
    for col in ("suite", "case", "result", "s", "detail"):
        table.add_column(col)
    for item in report.items:
        first = item.detail.splitlines()[0] if item.detail else ""
        mark = "[yellow]skipped[/]" if item.skipped is not None else "[green]pass[/]" if item.passed else "[red]FAIL[/]"
        table.add_row(escape(item.suite), escape(item.name), mark, f"{item.seconds:.2f}", escape(first[:160]))
    console.print(table)
    failures = [i for i in report.items if not i.passed]
    for item in failures:
        console.print(f"{item.suite} {item.name}", style="bold red", markup=False, highlight=False)
        console.print(item.detail, markup=False, highlight=False)
    verdict = "[bold green]all passed[/]" if not failures else f"[bold red]{len(failures)} failed[/]"
    skips = [i for i in report.items if i.skipped is not None]
    ran = len(report.items) - len(skips)
    console.print(f"{ran} cases, {verdict}" + (f"; {len(skips)} parts skipped" if skips else ""))


# --------------------------------------------------------------------------------------------- under torchrun

def draw_plans(world: int, count: int, seed: int, device: str = "cpu") -> list:
    """The plans a seeded fuzz budget draws (generation only: shrinking needs `meshsim fuzz` locally)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from .strategies import plans

    drawn: list = []
    if count <= 0:
        return drawn

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(plans(world, device=device))
    def collect(plan: Any) -> None:
        drawn.append(plan)

    collect()
    return drawn[:count]


def run_torchrun(args: Any) -> int:
    """The suite on the ranks torchrun started: every rank runs every case; rank 0 reports; all exit alike."""
    import json
    import signal
    import warnings

    from ..check import check
    from ..judge.report import make_console
    from ..run.torchrun import TorchrunExecutor
    from ..spec.plan import Plan

    # torchrun stops the other ranks with SIGTERM when one fails; a rank stuck in a C++ wait never returns
    # to Python to run a handler, so let the default action end it at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    warnings.simplefilter("ignore")  # torch's deprecation chatter, once per rank, would bury the report
    report: NightlyReport | None = None
    cases: list[Case] = []

    def on_hang(work: Any, record: Any) -> None:
        case = next((c for c in cases if c.plan == work.plan), Case("plan", "plan", work.plan, work.deadline))
        hang_report(executor, args, report, case, work, record)

    executor = TorchrunExecutor(args.backend, on_hang)
    report = NightlyReport(str(executor.topology), executor.backend, args.seed, mode="torchrun")
    raw = executor.share("suite", lambda: json.dumps([c.to_json() for c in
                                                      _suite(args, executor.world, executor.platform.device)]))
    cases.extend(Case.from_json(c, Plan.from_dict) for c in json.loads(raw))
    for case in cases:
        verdict = check(executor, case.plan, case.deadline)
        if executor.rank == 0:
            report.items.append(case.item(verdict))
    code = 0
    if executor.rank == 0:
        missing = suite_scenarios(args.scenarios, executor.world)[1]
        report.items.extend([missing] if missing else [])
        if not args.examples:
            report.items.append(skipped("fuzz", "--examples 0"))
        report.items.append(skipped("example", "the recipe's examples are user functions run by a local cluster; "
                                               "under torchrun meshsim runs plans (run them with `meshsim examples`)"))
        render(report, make_console())
        write_outputs(report, args.json_out, args.junit)
        code = 0 if report.passed else 1
    return executor.close(code)


@dataclass
class Case:
    """One case of the suite under torchrun: a plan, its deadline, and the scenario file it comes from (whose
    [expect] judges it, as `meshsim run` does) or none (a fuzz plan must agree with the model)."""

    suite: str
    name: str
    plan: Any
    deadline: float
    scenario: str | None = None

    def to_json(self) -> dict:
        return {"suite": self.suite, "name": self.name, "plan": self.plan.to_dict(), "deadline": self.deadline,
                "scenario": self.scenario}

    @classmethod
    def from_json(cls, data: dict, plan_from: Any) -> Case:
        return cls(data["suite"], data["name"], plan_from(data["plan"]), data["deadline"], data["scenario"])

    def item(self, verdict: Any) -> Item:
        if self.scenario is not None:
            return scenario_item(load(self.scenario), verdict)
        return _result_item(self.suite, self.name, verdict)


def _suite(args: Any, world: int, device: str) -> list[Case]:
    cases = [Case("scenario", sc.name, sc.plan, sc.deadline, sc.path)
             for sc in suite_scenarios(args.scenarios, world)[0]]
    for index, plan in enumerate(draw_plans(world, args.examples, args.seed, device)):
        cases.append(Case("fuzz", f"fuzz seed {args.seed} #{index}", plan, args.deadline))
    return cases


def _result_item(suite: str, name: str, result: Any) -> Item:
    from .properties import render_text

    detail = result.outcome if result.passed else render_text(result)
    return Item(suite, name, result.passed, result.record.elapsed, detail,
                {"outcome": result.outcome, "findings": sorted(result.findings),
                 "diagnosis": result.diagnosis.to_json() if result.diagnosis is not None else None})


def hang_report(executor: Any, args: Any, report: Any, case: Case, work: Any, record: Any) -> None:
    """A plan under torchrun ran past its deadline: judge it as any run is judged, print it, and write the report
    so far (every rank exits after this)."""
    from ..check import prediction_for
    from ..judge.report import make_console, render_verdict
    from ..judge.verdict import judge

    prediction = prediction_for(work.plan, executor.world, work.deadline, executor.platform)
    verdict = judge(record, "plan", work.plan, prediction)
    console = make_console()
    console.print(f"{case.suite} {case.name}: hang past its {work.deadline:g} s deadline (reported by rank "
                  f"{executor.rank})", style="bold red", markup=False, highlight=False)
    render_verdict(verdict, console)
    report = report or NightlyReport(str(executor.topology), executor.backend, args.seed, mode="torchrun")
    report.items.append(case.item(verdict))
    if executor.rank == 0:
        render(report, console)
    write_outputs(report, args.json_out, args.junit)
