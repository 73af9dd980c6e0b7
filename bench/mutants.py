"""Reach measured by the bugs it kills: mutation testing of torch's DeviceMesh and DTensor files, with a default
sweep as the test.

    python -m bench mutants                   the sample (a few hundred mutants), its table and figures
    python -m bench mutants --quick           a handful per file
    python bench/mutants.py --per-file 40 --seed 3 --jobs 2 --results run.jsonl --report run.md

The mutations are cosmic-ray's operators (binary, comparison, unary and boolean operators, numbers, `not`, and/or,
break/continue, decorators, loops run zero times), applied with its own `mutate_code`. cosmic-ray's runner is not
used: it writes each mutant into the file it mutates and runs its workers in git clones, and the venv's torch stays
untouched here. Instead each mutant is written to a folder of its own and served in place of the installed module by
bench/mutant_site/sitecustomize.py, in every process of its sweep (the controller, the forkserver, the ranks).
(mutmut 3 was tried too: it only mutates functions at a module's top level and in its top-level classes, and
device_mesh.py defines DeviceMesh inside `if not is_available(): ... else:`, so it offered 145 mutants of that file,
none in DeviceMesh.)

Each mutant is one of:
- unclaimed: on a line meshsim/sweep/coverage-exclusions.toml excludes (a torch path meshsim does not claim, each
  with its reason). Counted, never sampled.
- killed: the sweep failed (torch disagreed with the model, or could not run). Its time is the sweep's wall time.
- survived: the sweep passed. "not reached" when the unmutated sweep (same seed) never ran the mutated statement:
  it passes by construction, so it is not run.
- timed out: the sweep did not end within the timeout.
- incompetent (cosmic-ray's word): the sweep failed because the mutated module no longer imports (a changed
  module-level expression); every test sees that, so it says nothing of reach and is left out of the score.
- equivalent: listed in bench/mutants-equivalent.toml with the reason it changes nothing a program can observe
  (still run: a listed mutant that is killed is reported as a wrong entry).
The score is killed / (sampled - equivalent - incompetent).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SITE = os.path.join(HERE, "mutant_site")
EQUIVALENT = os.path.join(HERE, "mutants-equivalent.toml")

FILES = ("torch/distributed/device_mesh.py", "torch/distributed/_mesh_layout.py",
         "torch/distributed/tensor/_redistribute.py", "torch/distributed/tensor/placement_types.py",
         "torch/distributed/tensor/_collective_utils.py", "torch/distributed/tensor/_api.py",
         "torch/distributed/tensor/_utils.py")
SWEEP = ("--hosts", "2", "--devices-per-host", "4", "--examples", "200")  # the README's first command
PER_FILE, QUICK_PER_FILE, SEED, TIMEOUT, KILL_GOAL_S, SCORE_GOAL = 40, 4, 32, 900.0, 60.0, 90.0
KILLED, SURVIVED, TIMED_OUT, NOT_REACHED = "killed", "survived", "timed out", "not reached"
INCOMPETENT = "incompetent"  # cosmic-ray's word: the mutated module no longer imports


@dataclass
class Mutant:
    """One mutation: cosmic-ray's operator and occurrence in one file, where it is, and what it makes of the line."""

    file: str
    operator: str
    occurrence: int
    line: int
    before: str
    after: str

    @property
    def key(self) -> str:
        return f"{self.file}:{self.operator}:{self.occurrence}"

    @property
    def module(self) -> str:
        return self.file[:-3].replace("/", ".")


@dataclass
class Outcome:
    mutant: Mutant
    status: str
    seconds: float = 0.0
    why: str = ""  # the sweep's first words about the failure, or why the mutant is equivalent
    equivalent: str = ""  # the reviewed reason, when bench/mutants-equivalent.toml lists the mutant


# ----------------------------------------------------------------------------------------------- the population


def torch_source(file: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    base = os.path.dirname(list(spec.submodule_search_locations or [""])[0]) if spec else ""
    with open(os.path.join(base, file), encoding="utf-8") as fh:
        return fh.read()


def _operators() -> list[tuple[str, object]]:
    import cosmic_ray.plugins

    out = []
    for name in cosmic_ray.plugins.operator_names():
        cls = cosmic_ray.plugins.get_operator(name)
        if not cls.arguments():  # the variable replacer and inserter need arguments: left out, as cosmic-ray does
            out.append((name, cls()))
    return out


def _in_annotation(node: object) -> bool:
    """Whether a parso node lies in a type annotation (a parameter's, a return's, a variable's): a mutation there
    either breaks the module's import, which every test sees and which says nothing of reach, or changes nothing."""
    child, parent = node, getattr(node, "parent", None)
    while parent is not None:
        kind = parent.type
        if kind == "annassign" and parent.children[1] is child:
            return True
        if kind == "tfpdef" and child is parent.children[-1] and len(parent.children) == 3:
            return True
        if kind == "funcdef":
            kids = parent.children
            arrow = next((i for i, k in enumerate(kids) if getattr(k, "value", None) == "->"), None)
            return arrow is not None and kids[arrow + 1] is child
        child, parent = parent, parent.parent
    return False


def mutants_of(file: str, source: str, only: set[str] | None = None) -> Iterator[Mutant]:
    """Every mutant of one file (of the operators named in `only`), in cosmic-ray's order (its occurrence numbers
    mean what they mean to it)."""
    from cosmic_ray.ast import ast_nodes, get_ast

    lines = source.splitlines()
    operators = [(name, op) for name, op in _operators() if only is None or name in only]
    counts = dict.fromkeys((name for name, _ in operators), 0)
    for node in ast_nodes(get_ast(source)):
        for name, operator in operators:
            for start, _end in operator.mutation_positions(node):  # type: ignore[attr-defined]
                occurrence = counts[name]
                counts[name] += 1
                if _in_annotation(node):
                    continue
                yield Mutant(file, name, occurrence, start[0], lines[start[0] - 1].strip(), "")


def mutate(mutant: Mutant, source: str) -> str:
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    code = mutate_code(source, cosmic_ray.plugins.get_operator(mutant.operator)(), mutant.occurrence)
    if code is None:
        raise ValueError(f"cosmic-ray made no mutation for {mutant.key}")
    return code


def changed_line(source: str, mutated: str) -> str:
    """What the mutated line reads (a removed decorator's line reads as nothing)."""
    for line in difflib.unified_diff(source.splitlines(), mutated.splitlines(), n=0, lineterm=""):
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


def diff(mutant: Mutant, source: str, mutated: str) -> str:
    return "\n".join(difflib.unified_diff(source.splitlines(), mutated.splitlines(), f"a/{mutant.file}",
                                          f"b/{mutant.file}", n=1, lineterm=""))


class Claims:
    """What meshsim claims of a file: the lines meshsim/sweep/coverage-exclusions.toml leaves out are not claimed;
    of the rest, the statements the unmutated sweep never ran (coverage.py's missing lines)."""

    def __init__(self, file: str, source: str, missing: set[int]):
        from coverage.python import PythonParser

        from meshsim.sweep.coverage import exclusions

        patterns = [r["pattern"] for r in exclusions() if file in r["files"] and r.get("kind", "exclude") == "exclude"]
        self.parser = PythonParser(text=source, filename=file,
                                   exclude="|".join(f"(?:{p})" for p in patterns) if patterns else None)
        self.parser.parse_source()
        self.missing = missing

    def claimed(self, line: int) -> bool:
        return line not in self.parser.excluded and self.parser.first_line(line) not in self.parser.excluded

    def reached(self, line: int) -> bool:
        return self.parser.first_line(line) not in self.missing


def sample(population: list[Mutant], size: int, seed: int, file: str) -> list[Mutant]:
    """`size` mutants of one file, the same for the same seed and population."""
    rng = random.Random(f"{seed}:{file}")
    return sorted(rng.sample(population, min(size, len(population))), key=lambda m: (m.line, m.key))


# ----------------------------------------------------------------------------------------------- running


def equivalents() -> list[dict]:
    with open(EQUIVALENT, "rb") as fh:
        return tomllib.load(fh).get("equivalent", [])


def equivalent_reason(mutant: Mutant, listed: list[dict]) -> str:
    for entry in listed:
        if (entry["file"], entry["operator"], entry["before"], entry["after"]) == (mutant.file, mutant.operator,
                                                                                 mutant.before, mutant.after):
            return entry["reason"]
    return ""


def sweep_command(seed: int, save: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "meshsim", "fuzz", *SWEEP, "--seed", str(seed), "--shrink-budget", "1",
            "--save", save, "--json", *extra]


def _environment(mutant: Mutant | None, folder: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [SITE, ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("MESHSIM_MUTANT_MODULE", None)
    env.pop("MESHSIM_MUTANT_FILE", None)
    if mutant is not None:
        env["MESHSIM_MUTANT_MODULE"] = mutant.module
        env["MESHSIM_MUTANT_FILE"] = os.path.join(folder, os.path.basename(mutant.file))
    return env


def _failure_words(stdout: str, stderr: str, code: int) -> str:
    """One line on why the sweep failed: the disagreement's outcome and first difference, or the error."""
    try:
        report = json.loads(stdout[stdout.index("{"):])
        failure = report.get("failure") or {}
        differences = failure.get("differences") or []
        first = differences[0] if differences else failure.get("outcome", "")
        return f"exit {code}: {str(first)[:200]}"
    except ValueError:
        tail = [line for line in (stderr or stdout).strip().splitlines() if line.strip()]
        return f"exit {code}: {tail[-1][:200] if tail else 'no output'}"


RUNNING: set[subprocess.Popen] = set()  # the sweeps under way: a signal to the runner ends them too


def _end_sweeps(signum: int, _frame: object) -> None:
    for process in list(RUNNING):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(128 + signum)


def _sweep(command: list[str], folder: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess | None:
    """One sweep in a session of its own: past the timeout (or when the runner is interrupted) the whole session
    goes (the controller, its forkserver and its ranks), not only the controller. None: it timed out."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder,
                               env=env, start_new_session=True)
    RUNNING.add(process)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        RUNNING.discard(process)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def run_one(mutant: Mutant, source: str, seed: int, timeout: float) -> Outcome:
    """The sweep with one mutant served in place of its module: killed when it fails."""
    with tempfile.TemporaryDirectory(prefix="meshsim-mutant-") as folder:
        with open(os.path.join(folder, os.path.basename(mutant.file)), "w", encoding="utf-8") as fh:
            fh.write(mutate(mutant, source))
        started = time.monotonic()
        env = _environment(mutant, folder)
        out = _sweep(sweep_command(seed, folder), folder, env, timeout)
        seconds = time.monotonic() - started
        if out is None:
            return Outcome(mutant, TIMED_OUT, seconds, f"no end within {timeout:g} s")
        if out.returncode == 0:
            return Outcome(mutant, SURVIVED, seconds)
        why = _failure_words(out.stdout, out.stderr, out.returncode)
        broken = _sweep([sys.executable, "-c", f"import {mutant.module}"], folder, env, timeout)
        if broken is not None and broken.returncode != 0:
            return Outcome(mutant, INCOMPETENT, seconds, _failure_words("", broken.stderr, broken.returncode))
    return Outcome(mutant, KILLED, seconds, why)


def baseline(seed: int, timeout: float) -> tuple[float, dict[str, set[int]]]:
    """The unmutated sweep with coverage: it must pass; what it never ran is where a mutant cannot be seen."""
    with tempfile.TemporaryDirectory(prefix="meshsim-mutant-") as folder:
        started = time.monotonic()
        out = _sweep(sweep_command(seed, folder, ("--coverage",)), folder, _environment(None, folder), timeout)
        seconds = time.monotonic() - started
    if out is None:
        raise SystemExit(f"the unmutated sweep did not end within {timeout:g} s: no mutant can be judged against it")
    if out.returncode != 0:
        raise SystemExit(f"the unmutated sweep failed ({_failure_words(out.stdout, out.stderr, out.returncode)}): "
                         "no mutant can be judged against it")
    report = json.loads(out.stdout[out.stdout.index("{"):])
    missing = {f["file"]: set(f["missing_lines"]) for f in report["torch_coverage"]["files"]}
    return seconds, missing


@dataclass
class FileResult:
    file: str
    mutants: int = 0  # every mutant of the file (annotations left out)
    unclaimed: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status and not o.equivalent)

    @property
    def equivalent(self) -> int:
        return sum(1 for o in self.outcomes if o.equivalent and o.status not in (KILLED, INCOMPETENT))

    @property
    def incompetent(self) -> int:
        return sum(1 for o in self.outcomes if o.status == INCOMPETENT)

    @property
    def survived(self) -> int:
        return self.count(SURVIVED) + self.count(NOT_REACHED)

    @property
    def judged(self) -> int:
        return len(self.outcomes) - self.equivalent - self.incompetent

    @property
    def score(self) -> float:
        return 100.0 * self.count(KILLED) / self.judged if self.judged else 100.0

    @property
    def kill_times(self) -> list[float]:
        return [o.seconds for o in self.outcomes if o.status == KILLED]

    @property
    def median_kill(self) -> float:
        return statistics.median(self.kill_times) if self.kill_times else 0.0


def _load(results: str | None) -> dict[str, dict]:
    if not results or not os.path.exists(results):
        return {}
    with open(results) as fh:
        return {row["key"]: row for row in map(json.loads, filter(str.strip, fh))}


def _save(results: str | None, outcome: Outcome) -> None:
    if results:
        row = {"key": outcome.mutant.key, **asdict(outcome)}
        with open(results, "a") as fh:
            fh.write(json.dumps(row) + "\n")


def measure(per_file: int, seed: int, jobs: int, timeout: float, results: str | None = None,
            files: tuple[str, ...] = FILES, say: object = print, keys: tuple[str, ...] = (), run: bool = True
            ) -> tuple[list[FileResult], float]:
    """Sample each file's claimed mutants and run the sweep against each (`jobs` at a time). `results`: a JSON-lines
    file of outcomes; those already there are not run again (a long run resumes where it stopped). `run` False: no
    sweep runs, the table holds what `results` has."""
    base_seconds, missing = baseline(seed, timeout) if run else (0.0, {})
    if run:
        say(f"unmutated sweep passed in {base_seconds:.0f} s")  # type: ignore[operator]
    done, listed, sources = _load(results), equivalents(), {f: torch_source(f) for f in files}
    table, todo = [], []
    for file in files:
        source = sources[file]
        claims = Claims(file, source, missing.get(file, set()))
        everything = list(mutants_of(file, source))
        claimed = [m for m in everything if claims.claimed(m.line)]
        entry = FileResult(file, len(everything), len(everything) - len(claimed))
        table.append(entry)
        chosen = [m for m in claimed if m.key in keys] if keys else sample(claimed, per_file, seed, file)
        for mutant in chosen:
            mutant.after = changed_line(source, mutate(mutant, source))
            reason = equivalent_reason(mutant, listed)
            if mutant.key in done:
                row = done[mutant.key]
                entry.outcomes.append(Outcome(mutant, row["status"], row["seconds"], row["why"], reason))
            elif not run:
                continue
            elif not claims.reached(mutant.line):
                entry.outcomes.append(Outcome(mutant, NOT_REACHED, 0.0, "the sweep never runs this line", reason))
                _save(results, entry.outcomes[-1])
            else:
                todo.append((entry, mutant, reason))
    # round robin over the files: a run stopped early (and resumed with --results) has sampled every file alike
    seen: dict[str, int] = {}
    turns = []
    for item in todo:
        seen[item[1].file] = seen.get(item[1].file, -1) + 1
        turns.append(seen[item[1].file])
    todo = [item for _, _, item in sorted(zip(turns, range(len(todo)), todo), key=lambda t: t[:2])]
    say(f"{len(todo)} mutants to run, {jobs} at a time")  # type: ignore[operator]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        running = {pool.submit(run_one, m, sources[m.file], seed, timeout): (e, r) for e, m, r in todo}
        for n, future in enumerate(concurrent.futures.as_completed(running), 1):
            entry, reason = running[future]
            outcome = future.result()
            outcome.equivalent = reason
            entry.outcomes.append(outcome)
            _save(results, outcome)
            say(f"[{n}/{len(todo)}] {outcome.status:10} {outcome.seconds:5.0f} s  "  # type: ignore[operator]
                f"{outcome.mutant.file}:{outcome.mutant.line}  {outcome.mutant.before} -> {outcome.mutant.after}")
    return table, base_seconds


# ----------------------------------------------------------------------------------------------- the report


def _short(file: str) -> str:
    return file.removeprefix("torch/distributed/")


def totals(table: list[FileResult]) -> FileResult:
    every = FileResult("all files", sum(e.mutants for e in table), sum(e.unclaimed for e in table))
    every.outcomes = [o for e in table for o in e.outcomes]
    return every


def render(table: list[FileResult], console: object) -> None:
    from rich.table import Table

    out = Table(title="mutants of torch's DeviceMesh and DTensor files against a default sweep", title_justify="left")
    for column in ("file", "mutants", "unclaimed", "sampled", "killed", "survived (not reached)", "timed out",
                   "equivalent", "incompetent", "score", "median time to kill", "slowest kill"):
        out.add_column(column)
    for e in [*table, totals(table)]:
        out.add_row(_short(e.file), str(e.mutants), str(e.unclaimed), str(len(e.outcomes)), str(e.count(KILLED)),
                    f"{e.survived} ({e.count(NOT_REACHED)})", str(e.count(TIMED_OUT)), str(e.equivalent),
                    str(e.incompetent), f"{e.score:.1f}%" if e.judged else "-", f"{e.median_kill:.0f} s",
                    f"{max(e.kill_times, default=0):.0f} s")
    console.print(out)  # type: ignore[attr-defined]


def markdown(table: list[FileResult], seed: int, per_file: int, base_seconds: float) -> str:
    """The table and every survivor with its diff (and every listed equivalent that was killed), as markdown."""
    lines = [f"# Mutants of torch's DeviceMesh and DTensor files (seed {seed}, {per_file} a file)", "",
             f"The test: `meshsim fuzz {' '.join(SWEEP)} --seed {seed}` (unmutated: passed in {base_seconds:.0f} s).",
             "", "| file | mutants | unclaimed | sampled | killed | survived (not reached) | timed out | equivalent "
             "| incompetent | score | median time to kill |", "|" + " --- |" * 11]
    for e in [*table, totals(table)]:
        lines.append(f"| {_short(e.file)} | {e.mutants} | {e.unclaimed} | {len(e.outcomes)} | {e.count(KILLED)} | "
                     f"{e.survived} ({e.count(NOT_REACHED)}) | {e.count(TIMED_OUT)} | {e.equivalent} | "
                     f"{e.incompetent} | {f'{e.score:.1f}%' if e.judged else '-'} | {e.median_kill:.0f} s |")
    sources = {e.file: torch_source(e.file) for e in table}
    kinds = (("Survivors", lambda o: o.status in (SURVIVED, NOT_REACHED, TIMED_OUT) and not o.equivalent),
             ("Equivalent (bench/mutants-equivalent.toml)", lambda o: o.status != KILLED and o.equivalent),
             ("Incompetent: the module no longer imports", lambda o: o.status == INCOMPETENT),
             ("Listed as equivalent, but killed: wrong entries", lambda o: o.status == KILLED and o.equivalent))
    for title, pick in kinds:
        chosen = [o for e in table for o in e.outcomes if pick(o)]
        lines += ["", f"## {title} ({len(chosen)})"]
        for o in chosen:
            m = o.mutant
            lines += ["", f"`{m.key}` line {m.line}: {o.status}" + (f" ({o.equivalent})" if o.equivalent else ""),
                      "```diff", diff(m, sources[m.file], mutate(m, sources[m.file])), "```"]
    return "\n".join(lines) + "\n"


def figures(table: list[FileResult]) -> list:
    from figures import Figure, goal

    out = []
    for e in (e for e in table if e.judged):  # a file with nothing judged has no score
        out.append(Figure("mutants", f"{_short(e.file)}: score", e.score, "%",
                          note=f"{e.count(KILLED)} of {e.judged} killed, {e.equivalent} equivalent"))
        out.append(Figure("mutants", f"{_short(e.file)}: median time to kill", e.median_kill, "s"))
    every = totals(table)
    out.append(goal(Figure("mutants", "score", every.score, "%",
                           note=f"{every.count(KILLED)} of {every.judged} killed"),
                    lambda f: f.value >= SCORE_GOAL, f">= {SCORE_GOAL:g}% of the non-equivalent mutants killed"))
    out.append(goal(Figure("mutants", "slowest kill", max(every.kill_times, default=0.0), "s"),
                    lambda f: f.value <= KILL_GOAL_S, f"each within {KILL_GOAL_S:g} s"))
    out.append(Figure("mutants", "median time to kill", every.median_kill, "s"))
    return out


def run(quick: bool = False) -> list:
    """bench's section: the default sample (a handful per file with --quick), its table and figures."""
    from rich.console import Console

    console = Console(width=200)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _end_sweeps)
    table, _ = measure(QUICK_PER_FILE if quick else PER_FILE, SEED, 2, TIMEOUT, say=console.print)
    render(table, console)
    return figures(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/mutants.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-file", type=int, default=PER_FILE, help=f"mutants sampled a file (default {PER_FILE})")
    parser.add_argument("--seed", type=int, default=SEED, help="the sample's and the sweep's seed")
    parser.add_argument("--jobs", type=int, default=2, help="sweeps at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds a mutant's sweep may take")
    parser.add_argument("--file", action="append", choices=FILES, help="only these files (default: all seven)")
    parser.add_argument("--key", action="append", default=[],
                        help="only this mutant (FILE:OPERATOR:OCCURRENCE, as a report names it); repeatable")
    parser.add_argument("--results", help="a JSON-lines file of outcomes: those in it are not run again")
    parser.add_argument("--no-run", action="store_true",
                        help="run nothing: the table and report of what --results holds (a run stopped early)")
    parser.add_argument("--report", help="write the table and every survivor's diff here (markdown)")
    args = parser.parse_args(argv)
    from rich.console import Console

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _end_sweeps)
    console = Console(width=200)
    table, base_seconds = measure(args.per_file, args.seed, args.jobs, args.timeout, args.results,
                                  tuple(args.file or FILES), say=console.print, keys=tuple(args.key),
                                  run=not args.no_run)
    render(table, console)
    if args.report:
        with open(args.report, "w") as fh:
            fh.write(markdown(table, args.seed, args.per_file, base_seconds))
        console.print(f"report written to {args.report}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main())
