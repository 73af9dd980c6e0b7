"""A sweep's tables: what was drawn, what was produced and checked, and how much of torch's code the ranks
reached (the end of `meshsim fuzz`, and bench's reach section)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .produced import CONDITIONS, MESH_KINDS, POSITIONS, SOURCES, TARGETS


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


def render_produced(produced: Any, console: Console, complete: bool = True) -> None:
    """What the sweep produced and then checked: derived meshes by kind, the redistribute transform matrix (source
    placement by position and target), and the conditions the transforms ran under; what never was, in red."""
    def count(n: int) -> str:
        return f"[bold red]{n}[/]" if not n else str(n)

    kinds = list(dict.fromkeys(MESH_KINDS.values()))
    console.print("derived meshes produced and checked: "
                  + ", ".join(f"{k} {count(produced.meshes[k])}" for k in kinds), highlight=False)
    table = Table(title="redistribute transforms produced and checked (moves on mesh dims of size > 1)",
                  title_justify="left")
    table.add_column("from")
    for position in POSITIONS:
        for target in TARGETS:
            table.add_column(f"{position} -> {target}", justify="right")
    for source in SOURCES:
        row = [source]
        for position in POSITIONS:
            for target in TARGETS:
                row.append("-" if (source, target) == ("R", "R") else count(produced.cells[(position, source,
                                                                                             target)]))
        table.add_row(*row)
    console.print(table)
    console.print("transforms ran under: " + ", ".join(f"{c} {count(produced.conditions[c])}" for c in CONDITIONS),
                  highlight=False)
    missing = produced.missing()
    if complete and any(missing.values()):  # a sweep stopped by a disagreement has not had its chance
        never = [*missing["meshes"], *(" ".join(c) for c in missing["cells"]), *missing["conditions"]]
        console.print(f"[bold red]never produced and checked:[/] {', '.join(never)}", highlight=False)


def render_reach(reach: Any, console: Console) -> None:
    """Coverage of torch's DeviceMesh code, and where it was never reached."""
    table = Table(title="torch's DeviceMesh and DTensor code reached (excluding the reviewed CPU-unreachable code)",
                  title_justify="left")
    for column in ("file", "lines", "branches", "lines never run", "branches never taken (from->to)"):
        table.add_column(column)
    for f in reach.files:
        table.add_row(f.path, f"{f.line_percent:.1f}%", f"{f.branch_percent:.1f}%",
                      _ranges(f.missing_lines), ", ".join(f"{a}->{b}" for a, b in f.missing_branches))
    console.print(table)
    console.print(f"branches reached: {reach.branch_percent:.1f}% of the reachable branches of these files "
                  f"({len(reach.reasons)} reviewed exclusions, see meshsim/sweep/coverage-exclusions.toml)",
                  highlight=False)


def _ranges(lines: list[int]) -> str:
    out: list[str] = []
    for line in lines:
        if out and out[-1].split("-")[-1] == str(line - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{line}"
        else:
            out.append(str(line))
    return ", ".join(out)
