"""A benchmark's figures: each measured value next to its anchor (a baseline measured in the same run) and its goal,
with the machine's load when it was taken; printed as one table, written as JSON, compared with an earlier JSON."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

MOVED = 0.10  # a figure that moved by more than this fraction since the compared run is called out


@dataclass
class Figure:
    """One measured value. `anchor`: the same work done without meshsim (or the reference it is held to), measured
    in the same run; `ratio` is value / anchor unless given; `goal` in words, and `met` whether it holds."""

    section: str
    name: str
    value: float
    unit: str
    anchor: float | None = None
    anchor_name: str = ""
    ratio: float | None = None
    goal: str = ""
    met: bool | None = None
    load: float = field(default_factory=lambda: os.getloadavg()[0])
    note: str = ""

    def __post_init__(self) -> None:
        if self.ratio is None and self.anchor:
            self.ratio = self.value / self.anchor

    @property
    def key(self) -> str:
        return f"{self.section}: {self.name}"


def goal(figure: Figure, holds: Callable[[Figure], bool], text: str) -> Figure:
    figure.goal, figure.met = text, bool(holds(figure))
    return figure


def machine() -> dict[str, Any]:
    """Where the figures were taken: CPUs, platform, load, torch's version, meshsim's commit."""
    try:
        import importlib.metadata

        torch_version = importlib.metadata.version("torch")
    except Exception:  # noqa: BLE001 -- a bench without torch still reports the rest
        torch_version = "?"
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=here, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=here,
                                    timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "?", False
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "load": [round(x, 2) for x in os.getloadavg()], "torch": torch_version,
            "commit": commit + ("+dirty" if dirty else "")}


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return ""
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return f"{text} {unit}".strip()


def table(figures: list[Figure], title: str = "meshsim bench") -> Table:
    out = Table(title=title, title_justify="left")
    for column in ("section", "figure", "value", "anchor (same run)", "ratio", "goal", "met", "load"):
        out.add_column(column, overflow="fold")
    for f in figures:
        met = "" if f.met is None else "[green]yes[/]" if f.met else "[red]no[/]"
        anchor = f"{_fmt(f.anchor, f.unit)} ({f.anchor_name})" if f.anchor is not None else f.anchor_name
        out.add_row(f.section, f.name + (f" [dim]({f.note})[/]" if f.note else ""), _fmt(f.value, f.unit), anchor,
                    "" if f.ratio is None else f"{f.ratio:.2f}x", f.goal, met, f"{f.load:.1f}")
    return out


def write(path: str, figures: list[Figure]) -> None:
    with open(path, "w") as fh:
        json.dump({"machine": machine(), "figures": [asdict(f) for f in figures]}, fh, indent=2)


def compare(path: str, figures: list[Figure], console: Console) -> None:
    """What moved since the run written to `path`: every figure both runs have, old -> new, changes over MOVED."""
    with open(path) as fh:
        old = json.load(fh)
    before = {f"{f['section']}: {f['name']}": f for f in old.get("figures", [])}
    out = Table(title=f"compared with {path} (commit {old.get('machine', {}).get('commit', '?')}, "
                      f"load {old.get('machine', {}).get('load', '?')})", title_justify="left")
    for column in ("figure", "then", "now", "change", "ratio then -> now"):
        out.add_column(column, overflow="fold")
    for f in figures:
        was = before.get(f.key)
        if was is None:
            out.add_row(f.key, "-", _fmt(f.value, f.unit), "new", "")
            continue
        change = (f.value - was["value"]) / was["value"] if was["value"] else 0.0
        style = "bold" if abs(change) > MOVED else "dim"
        ratios = "" if f.ratio is None or was.get("ratio") is None else f"{was['ratio']:.2f} -> {f.ratio:.2f}"
        out.add_row(f.key, _fmt(was["value"], f.unit), _fmt(f.value, f.unit), f"[{style}]{change:+.0%}[/]", ratios)
    for key in sorted(set(before) - {f.key for f in figures}):
        out.add_row(key, _fmt(before[key]["value"], before[key]["unit"]), "-", "not measured now", "")
    console.print(out)
