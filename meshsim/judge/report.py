"""The one report: every verdict (plan, function, script, replay) rendered the same way with rich, as text for
terminals, logs and assertion messages."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..core.outcome import CRASH, ERROR, HANG, MISMATCH, PASS, SLOW
from ..core.pace import rate_text
from ..core.ranks import group_text, ranks_text
from ..model import findings as F
from ..model import to_json

MAX_ROWS = 6
LOG_WIDTH = 140  # when not writing to a terminal (CI logs, pipes), do not wrap tables at 80 columns


def make_console(stderr: bool = False, file: Any = None, record: bool = False, width: int | None = None) -> Console:
    """The one way meshsim makes a console: a terminal's own width, LOG_WIDTH where output goes to a log or a pipe,
    plain text (no colour codes) into a file such as an assertion message's buffer, or recorded for SVG/HTML."""
    if file is not None:
        return Console(file=file, width=width or LOG_WIDTH, color_system=None, force_terminal=False, record=record)
    console = Console(stderr=stderr, record=record)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=width or LOG_WIDTH, record=record)
    return console


SHOW_AFTER_S = 3.0  # a run longer than this shows how far its ranks are


class RunWatch:
    """A run's progress on a rich Progress (meshsim.core.record.RunStatus, from the executor's `watch`): after
    SHOW_AFTER_S, a bar of the ranks whose part has ended; when the ranks have been quiet for a while, a line saying
    what they wait for (at most every QUIET_S). `fields`: the Progress's other columns' fields."""

    def __init__(self, progress: Any, label: str = "ranks", **fields: Any):
        self.progress, self.label, self.fields = progress, label, fields
        self.task: Any = None
        self.said = 0.0  # the run's time when it last said what it waits for

    def __call__(self, status: Any) -> None:
        from ..core.deadlines import QUIET_S

        if status.ended >= status.total or status.elapsed < SHOW_AFTER_S:
            if self.task is not None:
                self.progress.remove_task(self.task)
                self.task, self.said = None, 0.0
            return
        if self.task is None:
            self.task = self.progress.add_task(self.label, total=status.total, **self.fields)
        self.progress.update(self.task, completed=status.ended, total=status.total)
        if status.waiting and status.elapsed - self.said >= QUIET_S:
            self.said = status.elapsed
            self.progress.console.print(f"  still running after {status.elapsed:.0f} s, nothing new for "
                                        f"{status.quiet:.0f} s: {status.waiting}", style="dim", markup=False,
                                        highlight=False, soft_wrap=True)


class Steps:
    """A bar's parts: calling it marks one done (what: the one next); .watch shows a long run's ranks."""

    def __init__(self, bar: Any, task: Any, label: str):
        self.bar, self.task = bar, task
        self.watch = RunWatch(bar, f"  {label}: ranks", what="")

    def __call__(self, what: str) -> None:
        self.bar.update(self.task, advance=1, what=what)


@contextlib.contextmanager
def progress_bar(label: str, total: int, disable: bool = False) -> Iterator[Steps]:
    """A bar on stderr for a run of several parts (scenarios, the nightly suite, the recipe's examples): it
    shows where the run is and what it works on, and is gone when the run ends; a single part shows no bar of parts,
    but a long run still shows its ranks (Steps.watch). Yields Steps: step(what) marks one part done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[what]}"), TimeElapsedColumn()]
    with Progress(*columns, console=make_console(stderr=True), transient=True, disable=disable) as bar:
        task = bar.add_task(label, total=total, what="", visible=total > 1)
        yield Steps(bar, task, label)


OUTCOME_STYLE = {PASS: "green", MISMATCH: "red", ERROR: "red", HANG: "yellow", CRASH: "red", SLOW: "yellow"}


def short(value: Any, limit: int = 70) -> str:
    text = json.dumps(to_json(value), separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_verdict(verdict: Any, console: Console, title: str = "", show_plan: bool = True, stacks: bool = True,
                   groups: bool = False) -> None:
    """Any verdict, the one way: its headline, what differs from the model, the findings, the errors and their
    tracebacks, the hang diagnosis with its stacks, the process groups a script made, and what the ranks printed."""
    if verdict.work == "script":
        _script_head(verdict, console)
    else:
        _head(verdict, console, title)
    for note in verdict.notes:
        console.print(f"   note: {note}", style="dim", markup=False, highlight=False)
    if verdict.plan is not None and show_plan and (verdict.differences or not verdict.passed):
        for line in verdict.plan.describe():
            console.print(f"   {line}", style="dim", markup=False, highlight=False)
    if verdict.differences:
        render_differences(verdict.differences, console)
    if verdict.findings:
        render_findings(verdict.findings, console)
    if verdict.work == "function":
        _function_errors(verdict, console)
    if verdict.work == "script":
        _script_errors(verdict, console)
    if verdict.diagnosis is not None:
        render_diagnosis(verdict.diagnosis, console, stacks=stacks)
        if verdict.topology is not None:
            render_picture(verdict, console)
        if verdict.work == "script":
            _where_in_script(verdict, console)
    if verdict.work == "script" and (groups or not verdict.passed):
        render_groups(verdict, console)
    if not verdict.passed and verdict.work != "script":  # a script's output was shown live
        render_output(verdict.record.states, console)


render_result = render_verdict  # the name 0.2 had


def verdict_text(verdict: Any, width: int = 160) -> str:
    buffer = io.StringIO()
    render_verdict(verdict, make_console(file=buffer, width=width),
                   groups=True)
    return buffer.getvalue()


def verdict_summary(verdict: Any) -> str:
    """One line (and a line per failing group of ranks): the outcome, who failed how, the diagnosis."""
    if verdict.passed:
        return f"{verdict.outcome} on {verdict.world} ranks in {verdict.elapsed:.2f} s"
    lines = [f"{verdict.outcome} after {verdict.elapsed:.2f} s"]
    if verdict.work == "function":
        for ranks, error in _grouped_errors(verdict.results):
            lines.append(f"  ranks {ranks}: {error}")
    if verdict.diagnosis is not None:
        lines.append("  " + verdict.diagnosis.summary)
    return "\n".join(lines)


def _head(verdict: Any, console: Console, title: str) -> None:
    style = OUTCOME_STYLE.get(verdict.outcome, "white")
    if verdict.work == "plan":
        agrees = "agrees with the model" if verdict.passed else "DISAGREES with the model"
        expected = verdict.expected if isinstance(verdict.expected, str) else \
            f"{verdict.expected.right} (torch: {verdict.expected.torch})"
        said = f"  expected {expected}; {agrees}  "
    else:
        said = f"  {verdict.work} on {verdict.world} ranks  "
    console.print(Text.assemble((title + " " if title else ""), (verdict.outcome.upper(), f"bold {style}"), said,
                                (f"[{verdict.elapsed:.2f} s]", "dim")))


def render_output(states: list[Any], console: Console) -> None:
    """What the ranks printed, each line prefixed with its rank (shown with every failure)."""
    text = "".join(f"[rank{s.rank}]: {line}\n" for s in states for line in s.output.splitlines())
    if text.strip():
        console.print("Rank output:", style="bold")
        console.print(text.rstrip(), markup=False, highlight=False, style="dim")


# --------------------------------------------------------------------------------------------- user functions


def _function_errors(verdict: Any, console: Console) -> None:
    for which, error in _grouped_errors(verdict.results):
        console.print(f"ranks {which}: {error}", style="bold red", markup=False, highlight=False, soft_wrap=True)
    tracebacks: dict[str, list[int]] = {}
    for r in verdict.results:
        if r.traceback:
            tracebacks.setdefault(r.traceback, []).append(r.rank)
    for text, ranks in tracebacks.items():
        console.print(f"  traceback of ranks {ranks_text(ranks)}:\n    " + text.strip().replace("\n", "\n    "),
                      style="dim", markup=False, highlight=False)


def _grouped_errors(results: list[Any]) -> list[tuple[str, str]]:
    groups: dict[str, list[int]] = {}
    for r in results:
        if not r.ok and r.error is not None:
            groups.setdefault(explain_error(r.error), []).append(r.rank)
    return [(ranks_text(ranks), text) for text, ranks in groups.items()]


def explain_error(error: Any) -> str:
    """An error in words, with what to do about the classic trap of functions pickled by value."""
    text = repr(error)
    if isinstance(error, NameError):
        found = re.search(r"name '([^']+)' is not defined", str(error))  # .name does not survive pickling
        name = found.group(1) if found else str(error)
        text += (f" -- the name {name!r} does not exist on the ranks. run_fn sends your function by value, so the "
                 "globals it uses must exist in the ranks' processes too; a name imported or defined under "
                 "`if __name__ == \"__main__\":` exists only in your own process. Import it inside the function, "
                 "or at the top of its module.")
    return text


# --------------------------------------------------------------------------------------------- scripts

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def _script_head(verdict: Any, console: Console) -> None:
    head = {PASS: "all ranks exited 0"}.get(verdict.outcome, verdict.outcome)
    console.print(f"meshsim launch {os.path.basename(verdict.script)} on {verdict.topology} "
                  f"({verdict.elapsed:.2f} s): {head}", markup=False, highlight=False)
    if verdict.attempts:
        n = len(verdict.attempts)
        console.print(f"  restarted every rank {n} time{'s' if n > 1 else ''} (--max-restarts); this was attempt {n} "
                      f"(TORCHELASTIC_RESTART_COUNT={n})", markup=False, highlight=False)
        for number, attempt in enumerate(verdict.attempts):
            for line in failure_lines(attempt)[:MAX_ROWS]:
                console.print(f"    attempt {number} failed: {line}", markup=False, highlight=False, soft_wrap=True)
    if not verdict.passed:
        codes = ", ".join(f"{r}:{c}" for r, c in enumerate(verdict.exit_codes))
        console.print(f"  exit codes by rank: {codes}", markup=False, highlight=False)


def _script_errors(verdict: Any, console: Console) -> None:
    for ranks, key, text in grouped_tracebacks(verdict):
        console.print(f"{_ranks_said(ranks)}: {key}", style="bold red", markup=False, highlight=False, soft_wrap=True)
        console.print("  " + text.strip().replace("\n", "\n  "), style="dim", markup=False, highlight=False)
    for line in _silent_failures(verdict):
        console.print(line, style="bold red", markup=False, highlight=False)


def failure_lines(verdict: Any) -> list[str]:
    """A script's failures, one line each, identical ones merged by rank: "ranks 4-7: RuntimeError: CUDA error:
    invalid device ordinal at 2d_setup.py:13", "rank 1: exited with code 3", "rank 2: died (signal 9)"."""
    lines = [(ranks, f"{_ranks_said(ranks)}: {key}") for ranks, key, _ in grouped_tracebacks(verdict)]
    lines += _silent_failures(verdict, with_ranks=True)
    culprits = set(verdict.culprits)  # the cause first: a peer that failed because of it comes after
    return [line for _, line in sorted(lines, key=lambda item: (not culprits & set(item[0]), item[0]))]


def _ranks_said(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}"


def _silent_failures(verdict: Any, with_ranks: bool = False) -> list[Any]:
    """Ranks that failed without an exception: a non-zero exit code of their choosing (sys.exit's message with
    it), or death by a signal. Exits that differ only in numbers (a rank in sys.exit's message) are one."""
    from ..core.wire import DIED, RAISED

    ends: dict[str, tuple[list[int], str]] = {}
    for state, code in zip(verdict.record.states, verdict.exit_codes):
        if state.end == RAISED and state.value is not None and not state.value.traceback:
            end = state.where  # "exited with code 3", with sys.exit's message and line
            key = re.sub(r"\d+", "N", end)
        elif state.end == DIED:  # (signal 9 and signal 11 are two ends)
            how = f"killed by signal {-code}" if isinstance(code, int) and code < 0 else f"exit code {code}"
            key = end = f"died ({how}, no exception)"
        else:
            continue
        ends.setdefault(key, ([], end))[0].append(state.rank)
    lines = [(ranks, f"{_ranks_said(ranks)}: {end}") for ranks, end in ends.values()]
    return lines if with_ranks else [line for _, line in lines]


def _where_in_script(verdict: Any, console: Console) -> None:
    for rank, stack in sorted(verdict.record.stacks.items()):
        at = where_in_script(stack, verdict.script)
        if at:
            console.print(f"  rank {rank} is at {at}", markup=False, highlight=False)


def where_in_script(stack: str, script: str) -> str | None:
    """The innermost frame of the user's code in a faulthandler stack: "train.py:42 (in step)"."""
    base = os.path.dirname(script) if os.path.isfile(script) else None
    for match in _FRAME.finditer(stack):  # most recent call first
        path = match.group("file")
        if path == script or (base and path.startswith(base + os.sep) and "site-packages" not in path):
            return f"{os.path.basename(path)}:{match.group('line')} (in {match.group('func')})"
    return None


def grouped_tracebacks(verdict: Any) -> list[tuple[list[int], str, str]]:
    """Identical failures merged: (ranks, "RuntimeError: ... at 2d_setup.py:13", the traceback from the script on).

    Failures are the same when their exception type, place in the script and message agree but for numbers
    (rank 4 and rank 5 failing on "device 4" and "device 5" are one failure).
    """
    groups: dict[str, tuple[list[int], str, str]] = {}
    for state in verdict.record.states:
        done = state.value
        if done is None or not done.traceback:
            continue
        text = _from_script_on(done.traceback, verdict.script)
        headline = done.error or error_line(text)
        at = done.site or _script_line(text, verdict.script)
        title = f"{headline} at {at}" if at else headline
        key = re.sub(r"\d+", "N", title)
        groups.setdefault(key, ([], title, text))[0].append(state.rank)
    return [(ranks, title, text) for ranks, title, text in groups.values()]


def error_line(traceback_text: str) -> str:
    """The exception's own "Type: message" line of a traceback. Its last line is not it when the message spans
    lines, or when a chained exception or a note follows."""
    lines = [line.rstrip() for line in traceback_text.strip().splitlines()]
    last_frame = max((i for i, line in enumerate(lines) if line.lstrip().startswith('File "')), default=-1)
    for line in lines[last_frame + 1:]:
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning|Failed|Failure)\b.*", line) or \
                re.match(r"^[A-Za-z_][\w.]*: ", line):
            return line.strip()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def _script_line(text: str, script: str) -> str | None:
    """The last place in the user's script that the traceback passes (where the failure started for them)."""
    found = [m for m in re.finditer(r'File "([^"]+)", line (\d+)', text) if m.group(1) == script]
    return f"{os.path.basename(script)}:{found[-1].group(2)}" if found else None


def _from_script_on(text: str, script: str) -> str:
    """A traceback without meshsim's and runpy's frames above the script's first one."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if f'File "{script}"' in line), None)
    if first is None:
        return text
    return "\n".join(lines[:1] + lines[first:])


def group_map(record: Any, topology: Any) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Every process group the run made: (name, ranks, hosts, what made it); and ranks left out of a kind."""
    groups: dict[str, tuple[tuple[int, ...], str]] = {}
    for state in record.states:
        for name, ranks in state.created.items():
            kind = state.created_as.get(name, "new_group")
            groups.setdefault(name, (ranks, kind))
    rows = []
    for name, (ranks, kind) in sorted(groups.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
        hosts = sorted({topology.host_of(r) for r in ranks})
        rows.append((name, list(ranks), hosts, kind))
    notes = []
    for kind in dict.fromkeys(kind for *_, kind in rows):
        members = {r for _, ranks, _, k in rows if k == kind for r in ranks}
        left = sorted(set(range(topology.world)) - members)
        if left and members:
            notes.append(f"ranks {ranks_text(left)} are in none of the groups made by {kind} (others are)")
    return rows, notes


# --------------------------------------------------------------------------------------------- the hang, drawn

PICTURE_STYLE = {"culprit": "bold white on red", "waiting": "black on yellow", "finished": "black on green",
                 "dead": "bold white on magenta", "raised": "white on dark_red", "running": "black on cyan"}
MAX_DRAWN = 16  # hosts, and ranks a host, drawn before the picture says "..."


def rank_states(verdict: Any, ranks: Any = None) -> dict[int, str]:
    """What the picture shows of each rank (of `ranks`, default every one): culprit, waiting, finished, dead,
    raised, or running (outside any call at the end)."""
    from ..core.wire import DIED, FINISHED, RAISED
    from .blame import blocked_call

    culprits = set(verdict.culprits)
    states = verdict.record.states
    out = {}
    for rank in range(len(states)) if ranks is None else ranks:
        s = states[rank]  # (where the model answered by class, the state of the rank's class)
        if rank in culprits:
            out[rank] = "culprit"
        elif s.end == DIED:
            out[rank] = "dead"
        elif blocked_call(s) is not None:
            out[rank] = "waiting"
        elif s.end == RAISED:
            out[rank] = "raised"
        elif s.end == FINISHED:
            out[rank] = "finished"
        else:
            out[rank] = "running"
    return out


def render_picture(verdict: Any, console: Console) -> None:
    """The ranks as a grid, a row a host, each coloured by its state; the group the headline wait is on (where a
    culprit is missing) is outlined with brackets."""
    from .diagnose import headline_wait

    topology, diagnosis = verdict.topology, verdict.diagnosis
    d = topology.devices_per_host
    drawn = [h * d + i for h in range(min(topology.hosts, MAX_DRAWN)) for i in range(min(d, MAX_DRAWN))]
    states = rank_states(verdict, drawn)
    wait = headline_wait(diagnosis.waits, diagnosis.culprits)
    outlined = set(wait.group_ranks) if wait is not None else set()
    width = len(str(topology.world - 1))
    what = "The hang" if verdict.outcome == HANG else "The failure"
    console.print(Text.assemble((f"{what}, a row a host", "bold"), "  (",
                                *[part for state in PICTURE_STYLE for part in ((f" {state} ", PICTURE_STYLE[state]),
                                                                                 " ")],
                                "; [ ] the group the others wait on)"))
    for host in range(min(topology.hosts, MAX_DRAWN)):
        line = Text(f"  host {host:>{len(str(topology.hosts - 1))}} ")
        for local in range(min(topology.devices_per_host, MAX_DRAWN)):
            rank = host * topology.devices_per_host + local
            edge = ("[", "]") if rank in outlined else (" ", " ")
            line.append(edge[0])
            line.append(f" {rank:>{width}} ", PICTURE_STYLE[states[rank]])
            line.append(edge[1])
        if topology.devices_per_host > MAX_DRAWN:
            line.append(f" ... {topology.devices_per_host - MAX_DRAWN} more")
        console.print(line)
    if topology.hosts > MAX_DRAWN:
        console.print(f"  ... {topology.hosts - MAX_DRAWN} more hosts", style="dim")


def save_picture(verdict: Any, directory: str) -> list[str]:
    """The hang's picture and diagnosis as hang.svg and hang.html in `directory` (for a browser, a ticket)."""
    console = make_console(file=io.StringIO(), record=True)
    render_picture(verdict, console)
    render_diagnosis(verdict.diagnosis, console, stacks=False)
    paths = [os.path.join(directory, "hang.svg"), os.path.join(directory, "hang.html")]
    console.save_svg(paths[0], title="meshsim: the hang", clear=False)
    console.save_html(paths[1])
    return paths


def render_groups(verdict: Any, console: Console) -> None:
    rows, notes = group_map(verdict.record, verdict.topology)
    table = Table(title="Process groups the script created", title_justify="left")
    for col in ("group", "ranks", "hosts", "made by"):
        table.add_column(col)
    for name, ranks, hosts, kind in rows:
        table.add_row(name, ranks_text(ranks), ",".join(map(str, hosts)), kind)
    if rows:
        console.print(table)
    for note in notes:
        console.print(f"  {note}", style="yellow", markup=False, highlight=False)


def render_differences(differences: list[Any], console: Console) -> None:
    table = Table(title="Differences from the model", title_justify="left", show_lines=False)
    for col in ("step", "op", "handle", "where", "ranks", "expected", "observed"):
        table.add_column(col, overflow="fold")
    shown = 0
    for diff in differences:
        for ranks, expected, observed in diff.rows:
            if shown >= MAX_ROWS * 3:
                break
            table.add_row(str(diff.step), diff.op, str(diff.handle or ""), diff.path or "(value)", ranks_text(ranks),
                          short(expected), short(observed))
            shown += 1
    console.print(table)
    total = sum(len(d.rows) for d in differences)
    if total > shown:
        console.print(f"   … {total - shown} more rows (use --json for all)", style="dim")


def render_findings(hits: dict[str, Any], console: Console) -> None:
    for fid, hit in hits.items():
        finding = F.get(fid)
        where = "; ".join(hit.where[:3]) + (" …" if len(hit.where) > 3 else "")
        ranks = f" on ranks {ranks_text(sorted(hit.ranks))}" if hit.ranks else ""
        fixed = f"; fixed {finding.fixed_with}" if finding.fixed_with else ""
        console.print(Text.assemble(("  finding ", "bold magenta"), (fid, "magenta"), f": {finding.title}",
                                    (f"  ({where}{ranks}{fixed})", "dim")))


def _render_paces(diagnosis: Any, console: Console) -> None:
    """A run too slow for its deadline: how far each rank got and how fast it was going."""
    table = Table(title="Where each rank was when the deadline struck", title_justify="left")
    for col in ("rank", "how far", "calls/s", "last call completed"):
        table.add_column(col, overflow="fold")
    for p in diagnosis.paces:
        rate = "" if p.rate is None else rate_text(p.rate)
        quiet = "" if p.quiet is None or p.finished else f"{p.quiet:.2f} s before the end"
        table.add_row(str(p.rank), diagnosis.elsewhere.get(p.rank, ""), rate, quiet)
    console.print(table)


def _alike(said: list[tuple[int, str]]) -> list[tuple[list[int], str]]:
    """Lines that say the same of several ranks, once: "rank 1 raised X" and "rank 2 raised X" are ranks 1-2 and
    "raised X" (in the order first said)."""
    grouped: dict[str, list[int]] = {}
    for rank, text in said:
        prefix = f"rank {rank} "
        grouped.setdefault(text[len(prefix):] if text.startswith(prefix) else text, []).append(rank)
    return [(ranks, text) for text, ranks in grouped.items()]


def render_diagnosis(diagnosis: Any, console: Console, stacks: bool = True) -> None:
    console.print(Text.assemble(("Diagnosis: ", "bold"), (diagnosis.kind, "bold yellow"), " — culprit ranks ",
                                (ranks_text(diagnosis.culprits) or "none identified", "bold")))
    console.print(f"  {diagnosis.summary}", markup=False, highlight=False, soft_wrap=True)
    for ranks, text in _alike([(c.rank, c.text) for c in diagnosis.causes[1:MAX_ROWS]]):  # (the headline's is said)
        if text not in diagnosis.summary:  # (a summary of ranks that all raised the same already says it)
            console.print(f"  also: {_ranks_said(sorted(ranks))} {text}", markup=False, highlight=False, soft_wrap=True)
    if diagnosis.candidates:
        console.print("  The evidence cannot decide between these ranks:", style="bold")
        for cause in diagnosis.candidates[:MAX_ROWS * 2]:
            console.print(f"    rank {cause.rank}: {cause.text}", markup=False, highlight=False, soft_wrap=True)
    if diagnosis.paces:
        _render_paces(diagnosis, console)
        return
    if diagnosis.waits:
        table = Table(title="Waiting ranks", title_justify="left")
        for col in ("rank", "step", "op", "call", "group", "mesh", "dim", "group coord", "missing"):
            table.add_column(col, overflow="fold")
        for w in diagnosis.waits:
            table.add_row(str(w.rank), str(w.step), str(w.op), w.call, group_text(w.group_ranks), str(w.mesh or ""),
                          "" if w.mesh_dim is None else str(w.mesh_dim),
                          "" if w.group_coordinate is None else str(w.group_coordinate), ranks_text(w.missing))
        console.print(table)
    if diagnosis.elsewhere:
        for ranks, where in _alike([(r, f"rank {r} {w}") for r, w in sorted(diagnosis.elsewhere.items())]):
            console.print(f"  {_ranks_said(sorted(ranks))}: {where}", style="dim", markup=False, highlight=False)
    paired = {r: text for r, text in diagnosis.victims.items() if "mismatched collective" in text}
    for rank, text in sorted(paired.items())[:MAX_ROWS]:
        console.print(f"  rank {rank}, not to blame: {text}", markup=False, highlight=False, soft_wrap=True)
    if len(paired) > MAX_ROWS:
        console.print(f"  ... {len(paired) - MAX_ROWS} more ranks completed mismatched collectives", style="dim")
    if stacks:
        for ranks, text in diagnosis.stacks:
            console.print(f"  Python stack of ranks {ranks_text(ranks)}:", style="bold")
            console.print("    " + text.replace("\n", "\n    "), style="dim", markup=False, highlight=False)
