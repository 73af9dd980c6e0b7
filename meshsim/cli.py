"""The `meshsim` command. Exit codes: 0 as expected, 1 a discrepancy/unexpected hang/crash, 2 bad input."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.markup import escape

from .core.deadlines import EXAMPLE_S, PLAN_S, SCENARIO_S, SHRINK_S, START_S
from .core.errors import InputError, MeshsimError
from .judge.report import make_console
from .spec.platform import BACKENDS

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(InputError):
    """Bad command-line input (one line, exit 2)."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as meshsim's: one line naming the command, exit 2 (`-h` shows the usage).

    fill(parser) adds the arguments when the command is used (`launch` reads torchrun's own parser, which imports
    torch: the other commands need not wait for it)."""

    def __init__(self, *args: Any, fill: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._fill = fill

    def _filled(self) -> None:
        fill, self._fill = self._fill, None
        if fill is not None:
            fill(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._filled()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._filled()
        return super().format_help()

    def format_usage(self) -> str:
        self._filled()
        return super().format_usage()

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} -h`)\n")


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def _deadline(text: str) -> float:
    from .core.deadlines import DeadlineError, checked

    try:
        return checked(float(text))
    except (ValueError, DeadlineError) as exc:
        raise argparse.ArgumentTypeError(str(exc) if isinstance(exc, DeadlineError) else
                                         f"expected a number of seconds, got {text!r}") from None


def _topology_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts", type=_positive(int), default=2, help="simulated hosts (default 2)")
    parser.add_argument("--devices-per-host", type=_positive(int), default=4,
                        help="simulated devices per host, one rank each (default 4)")


def _tier_options(parser: argparse.ArgumentParser) -> None:
    from .spec.tiers import TIERS

    parser.add_argument("--tier", default="process", choices=list(TIERS),
                        help="; ".join(f"{name}: {caps.describe}, up to {caps.max_world:,} ranks"
                                       for name, caps in TIERS.items()) + " (default: process)")
    parser.add_argument("--ranks", type=_positive(int), default=None,
                        help="fake tier: check this many ranks (every host's first and last first, then a seeded "
                             "spread) instead of all")


def _open(topology: Any, args: argparse.Namespace, deadline: float, **options: Any) -> Any:
    from .cluster import Cluster

    return Cluster(topology, backend=args.backend, deadline=deadline, tier=args.tier, ranks=args.ranks,
                   setup=args.setup, start_timeout=args.start_timeout, **options)


def _cluster_options(parser: argparse.ArgumentParser, deadline: float | None, what: str = "") -> None:
    parser.add_argument("--backend", default="gloo", choices=BACKENDS,
                        help="gloo on CPU (default), nccl one rank per GPU, auto = nccl when GPUs suffice")
    default = what or f"default {deadline:g}"
    parser.add_argument("--deadline", type=_deadline, default=deadline,
                        help=f"seconds each plan may take before it is called a hang ({default})")
    parser.add_argument("--setup", metavar="MODULE:FUNCTION",
                        help="a function every rank runs after it joins (e.g. to install a patched DeviceMesh)")
    parser.add_argument("--start-timeout", type=_deadline, default=None,
                        help=f"seconds the ranks and the setup function may take to be ready (default {START_S:g}, "
                             "more for many thread ranks)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="meshsim", description=(
        "A simulated multi-host cluster testbed for PyTorch DeviceMesh correctness."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    _plan_commands(sub)
    _suite_commands(sub)
    _script_commands(sub)
    _reference_commands(sub)
    return parser


def _plan_commands(sub: Any) -> None:
    """Plans checked against the model: generated (fuzz), from scenario files (run), and the findings they name."""
    fz = sub.add_parser("fuzz", help="generated plans on a simulated HxD cluster, checked against the model")
    _topology_options(fz)
    fz.add_argument("--examples", type=_positive(int), default=200,
                    help="how many generated plans to run (default 200)")
    fz.add_argument("--seed", type=int, default=None, help="the same seed draws the same plans")
    fz.add_argument("--max-steps", type=_positive(int), default=6)
    fz.add_argument("--divergent", action="store_true",
                    help="also draw plans where ranks diverge (skips, faults); these hang by design")
    fz.add_argument("--strict", action="store_true", help="count known findings as failures too")
    fz.add_argument("--save", metavar="DIR", default="meshsim-failures",
                    help="where the minimal counterexample is written as a scenario (default ./meshsim-failures)")
    fz.add_argument("--json", action="store_true", help="print the report as JSON")
    fz.add_argument("--shrink-budget", type=_deadline, default=SHRINK_S,
                    help=f"seconds shrinking a disagreement may take; the smallest failing plan so far then stands "
                         f"(default {SHRINK_S:g})")
    fz.add_argument("--coverage", action="store_true",
                    help="measure line and branch coverage of torch's DeviceMesh and DTensor files in the ranks "
                         "(process tier), and print per file what was never reached")
    _cluster_options(fz, deadline=None, what=f"default {PLAN_S:g}, more for more ranks on a tier")
    _tier_options(fz)

    run = sub.add_parser("run", help="run scenario files and check that each ends as it expects")
    run.add_argument("files", nargs="+", metavar="FILE")
    run.add_argument("--json", action="store_true", help="print results as JSON")
    run.add_argument("--no-stacks", action="store_true", help="leave Python stacks out of the text report")
    run.add_argument("--upgrade", action="store_true",
                     help="rewrite each file in the current scenario format instead (marking the steps the model "
                          "says raise with expect_error = true); docs/scenarios.md")
    _cluster_options(run, deadline=None, what=f"default: each file's own deadline, else {SCENARIO_S:g}, more for "
                                              "more ranks on a tier")
    _tier_options(run)

    fi = sub.add_parser("findings", help="list the known disagreements between torch, its docs and the model")
    fi.add_argument("--json", action="store_true")


def _suite_commands(sub: Any) -> None:
    """The standard suites: nightly, and the DeviceMesh recipe's examples."""
    ni = sub.add_parser("nightly", help="the standard suite (passing scenarios, a seeded fuzz budget, the recipe) "
                                       "with one report; under torchrun, on the ranks torchrun started")
    _topology_options(ni)
    ni.add_argument("--examples", type=int, default=300, help="fuzz budget in plans (default 300)")
    ni.add_argument("--seed", type=int, default=None, help="fuzz seed (default: today's date, e.g. 20261122)")
    ni.add_argument("--scenarios", default=None, metavar="DIR",
                    help="scenarios to include, those expecting pass on this world (default ./scenarios when it "
                         "exists; a directory named here must exist and hold scenarios)")
    ni.add_argument("--json-out", metavar="FILE", help="write the report as JSON")
    ni.add_argument("--junit", metavar="FILE", help="write the report as JUnit XML")
    ni.add_argument("--save", metavar="DIR", default="meshsim-failures", help="where a fuzz counterexample goes")
    ni.add_argument("--no-examples", action="store_true", help="leave out the recipe examples")
    ni.add_argument("--torchrun", action="store_true",
                    help="run as a torchrun rank (detected from torchrun's environment anyway)")
    ni.add_argument("--backend", default="auto", choices=BACKENDS,
                    help="auto (default) = nccl with one GPU per rank when there are enough, else gloo")
    ni.add_argument("--deadline", type=_deadline, default=PLAN_S, help=f"seconds per plan (default {PLAN_S:g})")
    ni.add_argument("--setup", metavar="MODULE:FUNCTION", help="a function every rank runs after it joins")

    rc = sub.add_parser("examples", help="every example of PyTorch's DeviceMesh recipe on a simulated 2x4 cluster")
    rc.add_argument("--json", action="store_true")
    rc.add_argument("--deadline", type=_deadline, default=EXAMPLE_S,
                    help=f"seconds each example may take (default {EXAMPLE_S:g})")


def _script_commands(sub: Any) -> None:
    """Users' own jobs: an unmodified torchrun script (launch), a hang's Flight Recorder dumps (replay)."""
    from .launch.options import add_arguments as launch_arguments

    sub.add_parser("launch", add_help=False, fill=launch_arguments,  # torchrun's parser brings its -h
                   help="run an unmodified torchrun script on simulated hosts x GPUs, bounded and diagnosed "
                        "(replace the word `torchrun`; every torchrun flag is read by torchrun's own parser)")

    rp = sub.add_parser("replay", help="a production hang rebuilt from its Flight Recorder dumps: culprits, a "
                                       "scenario file, and its replay on the simulated cluster")
    from .replay.cli import add_arguments

    add_arguments(rp)


def _reference_commands(sub: Any) -> None:
    """What meshsim knows, without running torch: the plan language (ops), the model's prediction (explain)."""
    op = sub.add_parser("ops", help="the plan language: every operation and its fields (generated from meshsim.ops)")
    op.add_argument("--markdown", action="store_true", help="as the Markdown table of docs/plan-language.md")

    ex = sub.add_parser("explain", help="what the model predicts for a scenario, rank by rank (no torch)")
    ex.add_argument("file", metavar="FILE")
    ex.add_argument("--rank", type=int, action="append", help="only these ranks (repeatable)")


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the real command line (not a test calling main): signals end the run at once
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, _terminate)
    parser = build_parser()
    args = parser.parse_args(argv)
    from .core.releases import beyond_known

    newer = beyond_known()
    if newer and args.command in CHECKS_TORCH:
        print(f"meshsim: {newer}", file=sys.stderr)  # the top of every report, before anything runs
    try:
        return COMMANDS[args.command](args)
    except MeshsimError as exc:
        print(f"meshsim: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, never wrapped
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (143) or Ctrl-C (130): one line, every cluster closed, and out, past whatever was running
    (Hypothesis would otherwise catch the exit and replay the plan)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    name = "interrupted" if signum == signal.SIGINT else "terminated"
    print(f"\nmeshsim: {name}; every rank was stopped", file=sys.stderr, flush=True)
    from .run.pool import close_all

    close_all(kill=True)
    os._exit(128 + signum)


def writable_file(path: str | None, option: str) -> None:
    """An output file must be writable before any work is done, or the work's result is lost at the end.

    Tried by writing beside it, not by os.access: root passes every access check and still cannot write under
    /proc or on a read-only mount."""
    if path is None:
        return
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a directory")
    _try_writing_in(os.path.dirname(os.path.abspath(path)), path, option)


def writable_dir(path: str | None, option: str) -> None:
    """An output directory is made now (as the run would make it) and written to once."""
    if path is None:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{option} {path}: not a directory")
    _try_writing_in(path, path, option)


def _try_writing_in(folder: str, path: str, option: str) -> None:
    import tempfile

    existing = os.path.abspath(folder)
    while not os.path.exists(existing):  # the root exists: this ends
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"{option} {path}: {existing} is not a directory")
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None


def cmd_fuzz(args: argparse.Namespace) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from .judge.report import RunWatch, render_result
    from .spec.topology import Topology
    from .sweep.loop import fuzz
    from .sweep.tables import render_draws, render_produced, render_reach

    topology = Topology(args.hosts, args.devices_per_host)
    writable_dir(args.save, "--save")
    out = make_console()
    err = make_console(stderr=True)
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[note]}"), TimeElapsedColumn()]
    measured = tempfile.TemporaryDirectory(prefix="meshsim-coverage-") if args.coverage else None
    options = {"coverage_dir": measured.name} if measured else {}
    with Progress(*columns, console=err, transient=True, disable=args.json) as progress, \
            _open(topology, args, args.deadline, watch=RunWatch(progress, "  this plan's ranks", note=""),
                  **options) as cluster:
        task = progress.add_task(f"fuzz {topology}", total=args.examples, note="")
        started = time.monotonic()

        said = [0.0]  # when a console that is not a terminal last got a line about shrinking

        def on_example(report: Any, result: Any) -> None:
            shrink = report.shrinking
            if shrink.started is None:
                note = f"{report.examples / max(time.monotonic() - started, 1e-9):.1f} plans/s"
            else:
                left = max(0.0, shrink.budget - shrink.elapsed)
                note = (f"[red]disagreement after {report.examples} plans ({result.outcome}); shrinking: "
                        f"{report.shrink_runs} runs, smallest {shrink.smallest} steps, {left:.0f} s left[/]")
                if not err.is_terminal and time.monotonic() - said[0] >= 10:  # a log, not a live bar
                    said[0] = time.monotonic()
                    err.print(f"fuzz: {note}", highlight=False)
            progress.update(task, completed=report.examples, note=note)

        report = fuzz(cluster, args.examples, seed=args.seed, deadline=args.deadline, max_steps=args.max_steps,
                      divergent=args.divergent, strict=args.strict, save_dir=args.save, on_example=on_example,
                      shrink_budget=args.shrink_budget)
    if measured is not None:  # the ranks have stopped and saved what they reached
        from .sweep.coverage import combine

        report.reach = combine(measured.name)
        measured.cleanup()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return EXIT_OK if report.passed else EXIT_FAIL
    for note in report.notes:
        out.print(f"note: {note}", style="dim", markup=False, highlight=False)
    backend = getattr(cluster, "backend", "no backend")
    out.print(f"{report.examples} plans on {topology} ({cluster.tier} tier, {backend}) "
              f"in {report.elapsed:.1f} s "
              f"= {report.rate:.1f} plans/s; outcomes {dict(report.outcomes)}")
    if report.findings:
        out.print("known findings exercised: " + ", ".join(f"{k} x{v}" for k, v in report.findings.most_common()))
    render_draws(report, out, full=args.coverage)
    render_produced(report.produced, out, complete=report.passed)
    if report.reach is not None:
        render_reach(report.reach, out)
    if report.passed:
        out.print("[bold green]torch agrees with the model on every plan[/]")
        return EXIT_OK
    out.print(f"[bold red]torch disagrees with the model[/] (found after {report.time_to_failure:.1f} s, "
              f"shrunk in {report.shrink_runs} runs). Minimal counterexample:")
    render_result(report.failure, out)
    if report.replayed_on:
        out.print(f"the failure shows on a smaller world too: {report.replayed_on}")
    if report.saved:
        out.print(f"saved as {report.saved}; replay with: meshsim run {report.saved}")
    return EXIT_FAIL


def cmd_run(args: argparse.Namespace) -> int:
    from .judge.report import progress_bar, render_diagnosis, render_result
    from .scenario.files import judge_scenario, load

    if args.upgrade:
        return _upgrade(args)
    scenarios = [load(path, deadline=args.deadline) for path in args.files]  # all valid before any runs
    out = make_console()
    runs = []
    clusters: dict[Any, Any] = {}
    last_use = {sc.topology: index for index, sc in enumerate(scenarios)}
    try:
        with progress_bar("scenarios", len(scenarios), disable=args.json) as step:
            for index, sc in enumerate(scenarios):
                cluster = clusters.get(sc.topology)
                if cluster is None:
                    cluster = clusters[sc.topology] = _open(sc.topology, args, sc.on_tier(args.tier),
                                                            watch=step.watch).start()
                result = cluster.run(sc.plan, deadline=sc.on_tier(args.tier))
                if last_use[sc.topology] == index:  # no file left needs these workers
                    clusters.pop(sc.topology).close()
                run = judge_scenario(sc, result)
                runs.append(run)
                step(sc.name)
                if not args.json:
                    _print_scenario(out, run, render_result, render_diagnosis, not args.no_stacks)
    finally:
        for cluster in clusters.values():
            cluster.close()
    if args.json:
        print(json.dumps([r.to_json() for r in runs], indent=2))
    else:
        matched = sum(r.matched for r in runs)
        style = "green" if matched == len(runs) else "red"
        out.print(f"[bold {style}]{matched}/{len(runs)} scenarios ended as expected[/]")
    return EXIT_OK if all(r.matched for r in runs) else EXIT_FAIL


def _upgrade(args: argparse.Namespace) -> int:
    from .scenario.upgrade import upgrade_files

    clusters: dict[Any, Any] = {}

    def run(sc: Any) -> Any:  # only for a file whose kind of hang the model cannot name
        if sc.topology not in clusters:
            clusters[sc.topology] = _open(sc.topology, args, sc.on_tier(args.tier)).start()
        return clusters[sc.topology].run(sc.plan, deadline=sc.on_tier(args.tier))

    try:
        return upgrade_files(args.files, run, args.json)
    finally:
        for cluster in clusters.values():
            cluster.close()


def _print_scenario(out: Console, run: Any, render_result: Any, render_diagnosis: Any, stacks: bool) -> None:
    sc, result = run.scenario, run.result
    mark = "[green]as expected[/]" if run.matched else "[red]NOT as expected[/]: " + escape("; ".join(run.problems))
    out.print(f"[bold]{escape(sc.name)}[/] ({escape(sc.path)}, {sc.topology}, deadline {sc.deadline:g} s): "
              f"{result.outcome} after {result.record.elapsed:.2f} s — {mark}", highlight=False)
    if result.differences or result.findings:
        render_result(result, out, show_plan=not run.matched)
        return
    for note in result.notes:  # where torch changed its choice, what a tier could not check
        out.print(f"   note: {note}", style="dim", markup=False, highlight=False)
    if result.diagnosis is not None:
        render_diagnosis(result.diagnosis, out, stacks=stacks)
    for note in run.notes:
        out.print(f"  [yellow]note:[/] {escape(note)}", highlight=False)


def cmd_findings(args: argparse.Namespace) -> int:
    from .judge.verdict import torch_version
    from .model import findings as F

    version = torch_version()
    if args.json:
        print(json.dumps([{"id": f.id, "title": f.title, "kind": f.kind, "detail": f.detail, "since": f.since,
                           "until": f.until, "verified_on": list(f.verified_on), "measured": f.measured,
                           "fixed_with": f.fixed_with, "applies": f.applies(version)}
                          for f in F.REGISTRY.values()], indent=2))
        return EXIT_OK
    out = make_console()
    for f in F.REGISTRY.values():
        applies = "applies to" if f.applies(version) else "does not apply to"
        fixed = f"; fixed {f.fixed_with}" if f.fixed_with else ""
        out.print(f"[bold magenta]{f.id}[/] ({f.kind}; {applies} torch {version}; {f.versions_text()}{fixed})\n"
                  f"  [bold]{f.title}[/]\n  {f.detail}\n", highlight=False)
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from .check import prediction_for
    from .model import to_json
    from .scenario.files import load

    sc = load(args.file)
    prediction = prediction_for(sc.plan, sc.topology.world, sc.deadline)
    out = make_console()
    if prediction.model_error is not None:
        out.print(f"{sc.name}: {prediction.model_error}", markup=False, highlight=False)
        return EXIT_FAIL
    out.print(f"[bold]{escape(sc.name)}[/]: model predicts [bold]{escape(str(to_json(prediction.outcome)))}[/] "
              f"(culprit ranks {prediction.culprits or 'none'}; findings {sorted(prediction.findings) or 'none'})")
    for line in sc.plan.describe():
        out.print(f"  {line}", markup=False, highlight=False)
    ranks = args.rank or range(sc.topology.world)
    bad = [r for r in ranks if not 0 <= r < sc.topology.world]
    if bad:
        raise UsageError(f"rank {bad[0]} is not in the world of {sc.topology.world}")
    stuck = {s.rank: s for s in prediction.stuck}
    for rank in ranks:
        pred = prediction.ranks[rank]
        end = pred.end if rank not in stuck else (f"waits forever in {stuck[rank].call.describe()} at step "
                                                  f"{stuck[rank].call.step}, missing {list(stuck[rank].missing)}")
        out.print(f"rank {rank} ({end})", style="bold", markup=False, highlight=False)
        for index, obs in enumerate(pred.observations):
            out.print(f"  step {index}: {json.dumps(to_json(obs))}", markup=False, highlight=False)
    return EXIT_OK


def cmd_nightly(args: argparse.Namespace) -> int:
    from .run.torchrun import under_torchrun
    from .spec.topology import Topology
    from .sweep.nightly import (
        check_scenarios_dir,
        default_seed,
        render,
        run_local,
        run_torchrun,
        write_outputs,
    )

    if args.seed is None:
        args.seed = default_seed()
    if args.examples < 0:
        raise UsageError("--examples must be 0 or more")
    if args.scenarios is not None:
        try:
            check_scenarios_dir(args.scenarios)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    else:
        args.scenarios = "scenarios"
    writable_file(args.json_out, "--json-out")
    writable_file(args.junit, "--junit")
    writable_dir(args.save, "--save")
    if args.torchrun and not under_torchrun():
        raise UsageError("--torchrun: this process was not started by torchrun (RANK, WORLD_SIZE, ... are not set)")
    if args.torchrun or under_torchrun():
        return run_torchrun(args)
    report = run_local(Topology(args.hosts, args.devices_per_host), args.backend, args.scenarios, args.examples,
                       args.seed, args.deadline, args.save, with_examples=not args.no_examples, setup=args.setup)
    render(report, make_console())
    write_outputs(report, args.json_out, args.junit)
    return EXIT_OK if report.passed else EXIT_FAIL


def cmd_examples(args: argparse.Namespace) -> int:
    from rich.table import Table

    from .cluster import Cluster
    from .examples import run_examples
    from .examples.recipe import TOPOLOGY
    from .spec.topology import Topology

    with Cluster(Topology(*TOPOLOGY), deadline=args.deadline) as cluster:
        results = run_examples(cluster, deadline=args.deadline)
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        table = Table(title="The DeviceMesh recipe on a simulated 2 hosts x 4 devices cluster (gloo, CPU)")
        for col in ("example", "result", "s", "what was checked"):
            table.add_column(col)
        for r in results:
            table.add_row(r.name, "[green]pass[/]" if r.passed else "[red]FAIL[/]", f"{r.seconds:.1f}", r.detail)
        make_console().print(table)
    return EXIT_OK if all(r.passed for r in results) else EXIT_FAIL


def cmd_launch(args: argparse.Namespace) -> int:
    from .launch.launcher import main

    writable_dir(args.log_dir, "--log-dir")
    writable_dir(args.host_dirs, "--host-dirs")
    if signal.getsignal(signal.SIGINT) is _terminate:
        # A hung script is what a user interrupts: the first Ctrl-C ends the run with its diagnosis (exit 130),
        # a second one at once.
        signal.signal(signal.SIGINT, _interrupt_once)
    return main(args)


def _interrupt_once(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGINT, _terminate)
    raise KeyboardInterrupt


def cmd_replay(args: argparse.Namespace) -> int:
    from .replay.cli import main as replay_main

    return replay_main(args)


def cmd_ops(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text

    from .ops import OPERATIONS, ROLES, reference_markdown

    if args.markdown:
        print(reference_markdown())
        return EXIT_OK
    table = Table(title="The plan language (meshsim.ops): one [[step]] per operation")
    for col in ("op", "kind", "what it does", "fields (* required)"):
        table.add_column(col)
    for op in sorted(OPERATIONS.values(), key=lambda o: (ROLES.index(o.role), o.name)):
        fields = ", ".join(f"{n}{'*' if n in op.required else ''}" for n in op.fields) or "-"
        # Text, not markup: docs say "[names...]" and "S(dim)", which rich would read as tags.
        table.add_row(*(Text(cell) for cell in (op.name, op.role, " ".join(op.doc.split()),
                                                 fields + ("; out*" if op.produces else ""))))
    make_console().print(table)
    return EXIT_OK


COMMANDS = {"launch": cmd_launch, "replay": cmd_replay, "ops": cmd_ops, "fuzz": cmd_fuzz, "run": cmd_run,
            "nightly": cmd_nightly, "examples": cmd_examples, "findings": cmd_findings, "explain": cmd_explain}
CHECKS_TORCH = ("launch", "replay", "fuzz", "run", "nightly", "examples", "explain")  # reports judged on torch

if __name__ == "__main__":
    sys.exit(main())
