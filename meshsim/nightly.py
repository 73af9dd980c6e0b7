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

from .scenario import Scenario, load


@dataclass
class Item:
    """One test case of the nightly report."""

    suite: str  # scenario | fuzz | example
    name: str
    passed: bool
    seconds: float
    detail: str = ""
    data: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"suite": self.suite, "name": self.name, "passed": self.passed, "seconds": round(self.seconds, 3),
                "detail": self.detail, **self.data}


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
                if not item.passed:
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
        if scenario.expect.outcome == "pass" and (world is None or scenario.topology.world == world):
            found.append(scenario)
    return found


def scenario_item(scenario: Scenario, result: Any) -> Item:
    from .scenario import judge_scenario
    from .testing import render_text

    run = judge_scenario(scenario, result)
    detail = "; ".join(run.problems) if run.problems else f"{result.outcome}"
    if run.problems:
        detail += "\n" + render_text(result)
    findings = sorted(result.findings)
    return Item("scenario", scenario.name, run.matched, result.record.elapsed, detail,
                {"outcome": result.outcome, "findings": findings})


def fuzz_item(report: Any, seed: int) -> Item:
    from .testing import render_text

    name = f"fuzz seed {seed} ({report.examples} plans)"
    if report.passed:
        detail = (f"{report.examples} plans, {report.rate:.1f}/s, outcomes {dict(report.outcomes)}, "
                  f"findings {dict(report.findings)}")
        return Item("fuzz", name, True, report.elapsed, detail, report.to_json())
    detail = (f"torch disagrees with the model; minimal plan saved as {report.saved}\n"
              + render_text(report.failure))
    return Item("fuzz", name, False, report.elapsed, detail, report.to_json())


def run_local(topology: Any, backend: str, scenarios_dir: str | None, examples: int, seed: int, deadline: float,
              save_dir: str, with_examples: bool = True, setup: Any = None) -> NightlyReport:
    from .cluster import Cluster
    from .fuzz import fuzz

    with Cluster(topology, backend=backend, deadline=deadline, setup=setup) as cluster:
        report = NightlyReport(str(topology), cluster.backend, seed)
        if scenarios_dir and os.path.isdir(scenarios_dir):
            for scenario in passing_scenarios(scenarios_dir, topology.world):
                report.items.append(scenario_item(scenario, cluster.run(scenario.plan, deadline=scenario.deadline)))
        if examples:
            result = fuzz(cluster, examples, seed=seed, deadline=deadline, save_dir=save_dir)
            report.items.append(fuzz_item(result, seed))
        if with_examples and cluster.backend == "gloo" and topology.hosts * topology.devices_per_host == 8:
            from .examples import run_examples

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
    from rich.table import Table

    table = Table(title=f"meshsim nightly — {report.topology} {report.backend} ({report.mode}), seed {report.seed}")
    for col in ("suite", "case", "result", "s", "detail"):
        table.add_column(col, overflow="fold")
    for item in report.items:
        first = item.detail.splitlines()[0] if item.detail else ""
        table.add_row(item.suite, item.name, "[green]pass[/]" if item.passed else "[red]FAIL[/]",
                      f"{item.seconds:.2f}", first[:160])
    console.print(table)
    failures = [i for i in report.items if not i.passed]
    for item in failures:
        console.print(f"[bold red]{item.suite} {item.name}[/]\n{item.detail}", markup=True, highlight=False)
    verdict = "[bold green]all passed[/]" if not failures else f"[bold red]{len(failures)} failed[/]"
    console.print(f"{len(report.items)} cases, {verdict}")

