"""`meshsim replay DUMP_DIR`: a hang from Flight Recorder dumps, diagnosed, written as a scenario, replayed.

The lead wires it into meshsim's command line with `add_arguments(subparser)` and `main(args)`.
Exit codes, as `meshsim run`: 1 when the hang reproduces (not replayed: when the dumps show one), 0 when the
replayed sequence completes (the dumps did not hold the cause, and the report says so), 2 dumps that cannot be
replayed (one line naming the file) or bad options.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..core import deadlines
from .dumps import ReplayError

TIERS = ("auto", "process", "thread", "fake", "model", "none")
DEFAULT_DEADLINE = 10.0  # the replay's own hang is over in this long: it waits for nothing but the deadline


def _deadline(text: str) -> float:
    try:
        return deadlines.checked(float(text))
    except (ValueError, deadlines.DeadlineError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dump_dir", metavar="DUMP_DIR",
                        help="a directory of Flight Recorder dumps, one file a rank (TORCH_FR_DUMP_TEMP_FILE + rank)")
    parser.add_argument("--tier", default="auto", choices=TIERS,
                        help="where the replay runs: auto (default: the process tier up to its 64 ranks, the thread "
                             "tier above), process, thread (to 1,024), model (the reference model alone), fake "
                             "(groups only: it cannot see hangs), or none (write the scenario, run nothing)")
    parser.add_argument("--deadline", type=_deadline, default=DEFAULT_DEADLINE,
                        help=f"seconds the replay may take before it is called a hang (default {DEFAULT_DEADLINE:g})")
    parser.add_argument("--scenario-out", dest="scenario_out", metavar="FILE", default=None,
                        help="where to write the scenario (default ./<name>.toml, the name from the dump directory)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    from .analyze import analyze
    from .dumps import read_dir
    from .incident import build
    from .to_scenario import to_scenario
    from .torch_analyzer import run_torch

    began = time.monotonic()
    try:
        dumpset = read_dir(args.dump_dir)
        incident = build(dumpset)
        analysis = analyze(incident)
        replay = to_scenario(incident, analysis, deadline=args.deadline)
        path = args.scenario_out or f"{replay.data['name']}.toml"
        scenario = replay.scenario(path)
    except ReplayError as exc:
        print(f"meshsim replay: {exc}", file=sys.stderr)
        return 2
    try:
        replay.save(path)
    except OSError as exc:
        print(f"meshsim replay: {path}: cannot write the scenario ({exc.strerror})", file=sys.stderr)
        return 2
    analysed = time.monotonic() - began
    torch_answer = run_torch(dumpset, incident)
    run, why_not = None, None
    tier = args.tier
    if tier == "auto":
        from ..spec.tiers import TIERS as CAPABILITIES

        tier = next((t for t in ("process", "thread") if incident.world <= CAPABILITIES[t].max_world), "none")
        if tier == "none":  # a diagnosis and a scenario, stated as such: no tier here holds the world
            why_not = (f"{incident.world} ranks are more than the thread tier's {CAPABILITIES['thread'].max_world} "
                       f"here; the diagnosis is from the dumps alone (replay it on a larger machine with --tier "
                       f"thread, or edit the scenario to a smaller world)")
    if tier != "none":
        run, why_not = _run(scenario, tier)
        if why_not is not None and run is None and why_not.startswith("!"):
            print(f"meshsim replay: {why_not[1:]}", file=sys.stderr)
            return 2
    report = _report(dumpset, incident, analysis, replay, path, torch_answer, run, why_not, analysed)
    report["judged"] = _judged(incident)
    if args.json:
        report["judged"] = report["judged"].to_json()
        print(json.dumps(report, indent=2, default=str))
    else:
        _print(report)
    return _exit_code(analysis, run)


def _exit_code(analysis: Any, run: Any) -> int:
    """As `meshsim run`: 1 when the hang reproduces (or, not replayed, when the dumps show one), 0 when the replayed
    sequence completes (the dumps did not hold the cause: the report says so)."""
    if run is None:
        return 1 if analysis.culprits or analysis.candidates else 0
    return 1 if run.result.outcome in ("hang", "crash", "error", "slow") else 0


def _run(scenario: Any, tier: str) -> tuple[Any, str | None]:
    """The scenario on `tier`, judged as `meshsim run` judges it; a world the tier cannot hold is refused."""
    from ..cluster import Cluster
    from ..core.errors import MeshsimError
    from ..scenario.files import judge_scenario

    try:
        cluster = Cluster(scenario.topology, tier=tier, deadline=scenario.deadline)
    except MeshsimError as exc:  # a world beyond the tier
        return None, f"!the scenario is written, but {exc}"
    try:
        cluster.start()
    except (MeshsimError, OSError) as exc:  # the ranks could not start here
        cluster.close()
        return None, f"!the scenario is written, but the {tier} tier could not start: {exc}"
    try:
        result = cluster.run(scenario.plan, deadline=scenario.deadline)
    finally:
        cluster.close()
    return judge_scenario(scenario, result), None


def _report(dumpset: Any, incident: Any, analysis: Any, replay: Any, path: str, torch_answer: Any, run: Any,
            why_not: str | None, analysed: float) -> dict:
    out = {"dump_dir": dumpset.directory, "files": len(dumpset.dumps), "read_with": dumpset.loader,
           "version": incident.version, "backend": incident.backend, "world": incident.world,
           "missing_ranks": incident.missing,
           "meshes": [{"shape": list(m.shape), "names": list(m.names)} for m in incident.meshes],
           "groups": [{"name": g.name, "desc": g.desc, "ranks": list(g.ranks), "members_from": g.source,
                       "mesh_dim": g.dim} for g in incident.groups.values()],
           "diagnosis": analysis.to_json(incident), "seconds_to_diagnose": round(analysed, 3),
           "scenario": os.path.abspath(path), "replaced": replay.replaced, "left_out": replay.left_out,
           "torch_analyzer": torch_answer.to_json(),
           "agreement": _agreement(analysis, torch_answer)}
    if run is not None:
        out["replay"] = run.to_json()
    elif why_not is not None:
        out["replay"] = {"ran": False, "why": why_not.lstrip("!")}
    return out


def _judged(incident: Any) -> Any:
    """The incident's record through meshsim's one judge: the same diagnosis a live hang gets."""
    from ..judge.verdict import judge
    from .analyze import to_record

    return judge(to_record(incident), "replay")


def _render_judged(verdict: Any) -> None:
    from ..judge.report import make_console, render_diagnosis

    if verdict.diagnosis is not None:
        render_diagnosis(verdict.diagnosis, make_console())


def _agreement(analysis: Any, torch_answer: Any) -> str:
    """Where meshsim's answer and torch's analyzer's differ: the culprits, the kind of failure, the file order."""
    if not torch_answer.available:
        return "torch's analyzer is not available"
    if torch_answer.failed is not None:
        return f"torch's analyzer fails on these dumps; meshsim names {analysis.culprits} ({analysis.kind})"
    ours = analysis.culprits
    theirs = torch_answer.culprits
    kinds = f"meshsim: {analysis.kind}; torch's analyzer: {', '.join(torch_answer.kinds) or 'nothing wrong'}"
    order = ""
    if torch_answer.order_dependent:
        answers = {v for v in torch_answer.by_order.values()}
        order = (f"; torch's answer depends on the order the files are listed in ({len(answers)} different "
                 f"answers in {len(torch_answer.by_order)} orders)")
    elif torch_answer.orders_left:
        order = f"; {len(torch_answer.by_order)} file orders tried, {torch_answer.orders_left} left for time"
    if theirs == ours:
        return f"agree on the culprits {ours} ({kinds}){order}"
    if not theirs:
        return f"differ: meshsim names {ours}; torch's analyzer names none, only missing ranks ({kinds}){order}"
    return f"differ: meshsim names {ours}, torch's analyzer {theirs} ({kinds}){order}"


def _print(report: dict) -> None:
    d = report["diagnosis"]
    missing = f", no dump from {report['missing_ranks']}" if report["missing_ranks"] else ""
    print(f"{report['files']} Flight Recorder dumps in {report['dump_dir']} (format {report['version']}, "
          f"{report['backend']}, world {report['world']}{missing})")
    for m in report["meshes"]:
        print(f"  mesh {tuple(m['shape'])} dims {m['names']}")
    print()
    _render_judged(report["judged"])
    for rank, text in sorted(d["culprits_at"].items(), key=lambda kv: int(kv[0])):
        print(f"  rank {rank} (culprit): {text}")
    for rank, text in sorted(d["victims"].items(), key=lambda kv: int(kv[0])):
        print(f"  rank {rank}: {text}")
    for text in d["completed_mismatched"]:
        print(f"  {text}")
    for note in d["notes"]:
        print(f"  note: {note}")
    t = report["torch_analyzer"]
    print(f"\ntorch's analyzer: {t['answer']}" + (f" (on the dumps as they are: {t['as_dumped']}; run with "
                                                  f"{'; '.join(t['filled_in'])})" if t["filled_in"] else ""))
    print(f"  {report['agreement']}")
    print(f"\nscenario: {report['scenario']}")
    replay = report.get("replay")
    if replay is None:
        print("  not run (--tier none); run it with: meshsim run " + report["scenario"])
    elif replay.get("ran") is False:
        print(f"  not run: {replay['why']}")
    else:
        verdict = "as the dumps say" if replay["matched"] else "NOT as the dumps say: " + "; ".join(replay["problems"])
        print(f"  replayed: {replay['outcome']} — {verdict}")
        if replay["outcome"] == "pass":
            print("  the replayed sequence completes: the dumps do not hold the cause of the hang (it lies in what "
                  "they do not record: point-to-point calls, a rank's own work, sizes gloo takes differently)")
        if replay.get("diagnosis"):
            print(f"  meshsim's diagnosis of the replay: {replay['diagnosis'].get('summary', '')}")
