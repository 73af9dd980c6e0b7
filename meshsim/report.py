"""Human-readable reports (rich) of results, differences, findings and hang diagnoses."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import findings as F
from .model import to_json
from .outcome import CRASH, ERROR, HANG, MISMATCH, PASS

MAX_ROWS = 6
LOG_WIDTH = 140  # when not writing to a terminal (CI logs, pipes), do not wrap tables at 80 columns


def make_console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=LOG_WIDTH)
    return console
OUTCOME_STYLE = {PASS: "green", MISMATCH: "red", ERROR: "red", HANG: "yellow", CRASH: "red"}


def short(value: Any, limit: int = 70) -> str:
    text = json.dumps(to_json(value), separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ranks_text(ranks: list[int]) -> str:
    """[0,1,2,3,5] -> '0-3,5'."""
    ranks = sorted(set(ranks))
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)


def render_result(result: Any, console: Console, title: str = "", show_plan: bool = True) -> None:
    style = OUTCOME_STYLE.get(result.outcome, "white")
    verdict = "agrees with the model" if result.passed else "DISAGREES with the model"
    expected = result.expected if isinstance(result.expected, str) else f"{result.expected.right} (torch: {result.expected.torch})"
    head = Text.assemble((title + " " if title else ""), (result.outcome.upper(), f"bold {style}"),
                         f"  expected {expected}; {verdict}  ", (f"[{result.record.elapsed:.2f} s]", "dim"))
    console.print(head)
    for note in result.notes:
        console.print(f"   note: {note}", style="dim", markup=False, highlight=False)
    if show_plan and (result.differences or not result.passed):
        for line in result.plan.describe():
            console.print(f"   {line}", style="dim", markup=False, highlight=False)
    if result.differences:
        render_differences(result.differences, console)
    if result.findings:
        render_findings(result.findings, console)
    if result.diagnosis is not None:
        render_diagnosis(result.diagnosis, console)
    if not result.passed:
        render_output(result.record.states, console)


def render_output(states: list, console: Console) -> None:
    """What the ranks printed, each line prefixed with its rank (shown with every failure)."""
    from .functions import rank_output

    text = rank_output(states)
    if text.strip():
        console.print("Rank output:", style="bold")
        console.print(text.rstrip(), markup=False, highlight=False, style="dim")


def render_differences(differences: list, console: Console) -> None:
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


def render_findings(hits: dict, console: Console) -> None:
    for fid, hit in hits.items():
        finding = F.get(fid)
        where = "; ".join(hit.where[:3]) + (" …" if len(hit.where) > 3 else "")
        ranks = f" on ranks {ranks_text(sorted(hit.ranks))}" if hit.ranks else ""
        console.print(Text.assemble(("  finding ", "bold magenta"), (fid, "magenta"), f": {finding.title}",
                                    (f"  ({where}{ranks})", "dim")))


def render_diagnosis(diagnosis: Any, console: Console, stacks: bool = True) -> None:
    console.print(Text.assemble(("Diagnosis: ", "bold"), (diagnosis.kind, "bold yellow"), " — culprit ranks ",
                                (ranks_text(diagnosis.culprits) or "none identified", "bold")))
    console.print(f"  {diagnosis.summary}", markup=False, highlight=False)
    if diagnosis.waits:
        table = Table(title="Waiting ranks", title_justify="left")
        for col in ("rank", "step", "op", "call", "group", "mesh", "dim", "group coord", "missing"):
            table.add_column(col, overflow="fold")
        for w in diagnosis.waits:
            table.add_row(str(w.rank), str(w.step), str(w.op), w.call, str(w.group_ranks), str(w.mesh or ""),
                          "" if w.mesh_dim is None else str(w.mesh_dim),
                          "" if w.group_coordinate is None else str(w.group_coordinate), ranks_text(w.missing))
        console.print(table)
    if diagnosis.elsewhere:
        for rank, where in sorted(diagnosis.elsewhere.items()):
            console.print(f"  rank {rank}: {where}", style="dim", markup=False, highlight=False)
    if stacks:
        for ranks, text in diagnosis.stacks:
            console.print(f"  Python stack of ranks {ranks_text(ranks)}:", style="bold")
            console.print("    " + text.replace("\n", "\n    "), style="dim", markup=False, highlight=False)


def render_draws(report: Any, console: Console, full: bool = False) -> None:
    """How often each operation, and each pair of consecutive operations, was drawn."""
    if not report.ops:
        return
    console.print("ops drawn: " + ", ".join(f"{op} {n}" for op, n in report.ops.most_common()), markup=False,
                  highlight=False)
    console.print(f"{len(report.pairs)} distinct consecutive pairs drawn", highlight=False)
    if not full:
        return
    table = Table(title="consecutive pairs drawn (rarest last)", title_justify="left")
    for column in ("first", "then", "times"):
        table.add_column(column)
    for (first, then), n in report.pairs.most_common():
        table.add_row(first, then, str(n))
    console.print(table)


def render_reach(reach: Any, console: Console) -> None:
    """Coverage of torch's DeviceMesh code, and where it was never reached."""
    table = Table(title="torch DeviceMesh code reached (excluding the reviewed CPU-unreachable code)",
                  title_justify="left")
    for column in ("file", "lines", "branches", "lines never run", "branches never taken (from->to)"):
        table.add_column(column)
    for f in reach.files:
        table.add_row(f.path, f"{f.line_percent:.1f}%", f"{f.branch_percent:.1f}%",
                      _ranges(f.missing_lines), ", ".join(f"{a}->{b}" for a, b in f.missing_branches))
    console.print(table)
    console.print(f"branches reached: {reach.branch_percent:.1f}% of the reachable branches of both files "
                  f"({len(reach.reasons)} reviewed exclusions, see meshsim/data/coverage-exclusions.toml)",
                  highlight=False)


def _ranges(lines: list[int]) -> str:
    out: list[str] = []
    for line in lines:
        if out and out[-1].split("-")[-1] == str(line - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{line}"
        else:
            out.append(str(line))
    return ", ".join(out)
