"""`meshsim run --upgrade FILE`: an older scenario file rewritten in the current format, meaning what it meant.

What changes (meshsim.scenario.formats says why each rule differs):
- `format = 2` goes first;
- every step the model predicts raises on some rank (files.raising_steps: as torch and as is right alike) gets
  `expect_error = true`, as 0.2 did not ask for. The model alone answers this: no cluster starts;
- a deadline under 1 s becomes 1 s, and every sleep is stretched alike (as format 1 reads it);
- an [expect] kind of 0.2's that today's diagnosis tells apart more finely ("skipped collective" may now be a
  "mismatched collective") is replaced by the kind the run shows, if it is one 0.2 called by that name. The model
  cannot answer this one (its diagnosis of a drawn hang differs from a run's in about one case in four), so the
  file runs once, on the tier asked for; nothing else runs.
The file keeps its text, comments included: only those lines are added or changed. Where that cannot be done
(steps written as an inline array, say) the whole file is rewritten from its table, and the report says so.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from ..core.ranks import ranks_text
from . import formats
from .files import Scenario, ScenarioError, judge_scenario, load, parse, raising_steps

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_STRING_DELIMS = ('"""', "'''")


@dataclass
class Upgrade:
    """What upgrading one file did, in lines a person reads."""

    path: str
    old_format: int
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how it was done, where that is worth saying
    warnings: list[str] = field(default_factory=list)  # what could not be carried over: the user must look
    ran: bool = False  # whether the file ran (to learn a kind of hang)
    whole: bool = False  # rewritten from its table (comments and layout lost)

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.path, "from_format": self.old_format, "to_format": formats.CURRENT,
                "changed": self.changed, "changes": self.changes, "notes": self.notes, "warnings": self.warnings,
                "ran": self.ran, "rewritten_whole": self.whole}


def needs_run(scenario: Scenario) -> bool:
    """Whether upgrading this file must run it: its [expect] kind is one of 0.2's that today splits."""
    kind = scenario.expect.kind
    return scenario.format == formats.LEGACY and kind is not None and len(formats.KIND_FAMILIES.get(kind, ())) > 1


def upgrade(path: str | Path, run: Callable[[Scenario], Any] | None = None) -> Upgrade:
    """Rewrite one scenario file in the current format. `run(scenario) -> Verdict` runs it, for a kind of hang
    (needs_run); without it such a kind is kept and a warning says so. ScenarioError for a file that is not a
    valid scenario (nothing is written then)."""
    path = Path(path)
    scenario = load(path)  # valid, read as its format means it
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    done = Upgrade(str(path), scenario.format)
    if scenario.format == formats.CURRENT:
        return done
    target = copy.deepcopy(data)
    target[formats.KEY] = formats.CURRENT
    marks = _marks(scenario, done)
    for index in marks:
        target["step"][index]["expect_error"] = True
    factor = _deadline(data, target, scenario, done)
    kind = _kind(scenario, run, done)
    if kind is not None:
        target["expect"]["kind"] = kind
    sleeps = {i for i, st in enumerate(scenario.plan.steps) if st.op == "sleep"}
    new_text = _edited(text, marks, sleeps if factor != 1.0 else set(), factor, kind)
    if new_text is None or _loads(new_text) != target:
        new_text, done.whole = _whole(target), True
        done.notes.append("rewritten from its table: its comments and layout are not kept")
    parse(tomllib.loads(new_text), str(path))  # what it says now is a valid scenario, or nothing is written
    done.changes.insert(0, f"format = {formats.CURRENT} (was {scenario.format}: {formats.FORMATS[scenario.format]}'s "
                           "rules)")
    path.write_text(new_text, encoding="utf-8")
    return done


def _marks(scenario: Scenario, done: Upgrade) -> list[int]:
    """The steps to mark expect_error: those the model says raise and the file does not mark (fault steps raise
    by definition, and are not marked in any format)."""
    from ..check import prediction_for
    from ..ops import operation_of

    prediction = prediction_for(scenario.plan, scenario.topology.world, scenario.deadline)
    if prediction.model_error is not None:
        done.notes.append(f"the model cannot predict this plan ({prediction.model_error}), so no step is marked: "
                          f"format {formats.CURRENT} then names no step that raises either")
        return []
    marks = []
    for index, (error, ranks) in raising_steps(scenario.plan, prediction, scenario.topology.world).items():
        st = scenario.plan.steps[index]
        if st.expect_error or operation_of(st).role == "fault":
            continue
        marks.append(index)
        done.changes.append(f"step {index} ({st.op}): expect_error = true (the model says it raises on ranks "
                            f"{ranks_text(ranks)}: {error})")
    return marks


def _deadline(data: dict[str, Any], target: dict[str, Any], scenario: Scenario, done: Upgrade) -> float:
    """Carries format 1's reading of a deadline under 1 s into the table; returns the sleeps' factor."""
    if "deadline" not in data:
        return 1.0
    own, factor = formats.legacy_deadline(data["deadline"])
    if factor != 1.0:
        target["deadline"] = own
        target["step"] = formats.stretch_sleeps(target["step"], factor)
        done.changes.append(f"deadline {data['deadline']:g} s -> {own:g} s (format {formats.CURRENT}'s least), and "
                            f"every sleep stretched x{factor:g} with it")
    return factor


def _kind(scenario: Scenario, run: Callable[[Scenario], Any] | None, done: Upgrade) -> str | None:
    """Today's name for the file's kind of hang, when it differs from the one the file names."""
    if not needs_run(scenario):
        return None
    expected = scenario.expect.kind
    assert expected is not None
    family = formats.KIND_FAMILIES[expected]
    if run is None:
        done.warnings.append(f"[expect] kind {expected!r} kept unconfirmed: today it is one of "
                             f"{', '.join(sorted(family))}, and only a run tells which")
        return None
    result = run(scenario)
    done.ran = True
    seen = result.diagnosis.kind if result.diagnosis is not None else None
    verdict = judge_scenario(scenario, result)
    if seen is None or seen not in family or not verdict.matched:
        why = "; ".join(verdict.problems) or f"it ended {result.outcome} with no diagnosis"
        done.warnings.append(f"[expect] kind {expected!r} kept: the run does not end as the file says even by "
                             f"format {scenario.format}'s rules ({why})")
        return None
    if seen == expected:
        return None
    done.changes.append(f"[expect] kind {expected!r} -> {seen!r} (what today's diagnosis calls this hang, run once)")
    return seen


def _loads(text: str) -> dict[str, Any] | None:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def _whole(target: dict[str, Any]) -> str:
    ordered = {formats.KEY: target[formats.KEY], **{k: v for k, v in target.items() if k != formats.KEY}}
    return tomli_w.dumps(ordered)


def _edited(text: str, marks: list[int], sleeps: set[int], factor: float, kind: str | None) -> str | None:
    """The file's own text with the upgrade's lines added or changed; None where its layout is not the plain one
    (the caller checks the result against the table it must say, and rewrites the file whole otherwise)."""
    lines = text.splitlines(keepends=True)
    headers = _headers(lines)
    steps = [i for i, (_, name, array) in enumerate(headers) if array and name == "step"]
    if (marks or factor != 1.0) and not steps:
        return None
    edits: dict[int, str] = {}  # line index -> its new text
    inserts: dict[int, list[str]] = {}  # line index -> lines to put after it
    first_table = headers[0][0] if headers else len(lines)
    if factor != 1.0:
        if not _replace(lines, 0, first_table, "deadline", lambda v: _number(v, 1.0, floor=True), edits):
            return None
        for index in sleeps:
            if index >= len(steps):
                return None
            start, end = _region(headers, steps[index], len(lines))
            _replace(lines, start, end, "seconds", lambda v: _number(v, factor), edits, every=True)
    for index in marks:
        if index >= len(steps):
            return None
        start, end = _region(headers, steps[index], len(lines))
        if not _replace(lines, start + 1, end, "expect_error", lambda v: "true", edits):
            inserts.setdefault(_last_key(lines, headers, steps[index]), []).append("expect_error = true\n")
    if kind is not None:
        expect = [i for i, (_, name, array) in enumerate(headers) if not array and name == "expect"]
        if not expect:
            return None
        start, end = _region(headers, expect[0], len(lines))
        if not _replace(lines, start + 1, end, "kind", lambda v: json.dumps(kind), edits):
            return None
    out = []
    for i, line in enumerate(lines):
        line = edits.get(i, line)
        if i in inserts and not line.endswith("\n"):
            line += "\n"
        out.append(line)
        out.extend(inserts.get(i, []))
    first_table = next((i for i, line in enumerate(out) if _HEADER.match(line)), len(out))
    named = [i for i in range(first_table) if re.match(rf"\s*{formats.KEY}\s*=", out[i])]  # format = 1, say
    if named:
        out[named[0]] = f"{formats.KEY} = {formats.CURRENT}\n"
    else:
        top = next((i for i, line in enumerate(out) if line.strip() and not line.lstrip().startswith("#")), len(out))
        out.insert(top, f"{formats.KEY} = {formats.CURRENT}\n")
    return "".join(out)


def _headers(lines: list[str]) -> list[tuple[int, str, bool]]:
    """Table headers outside multi-line strings and arrays: (line index, dotted name without spaces, whether it is
    an [[array]] header)."""
    found = []
    inside: str | None = None  # the delimiter of the multi-line string a line starts in
    depth = 0  # brackets open from earlier lines: a multi-line array
    for i, line in enumerate(lines):
        if inside is None and depth == 0:
            match = _HEADER.match(line)
            if match:
                found.append((i, re.sub(r"\s+", "", match.group(2)), match.group(1) == "[["))
                continue
        inside, depth = _scan(line, inside, depth)
    return found


def _scan(line: str, inside: str | None, depth: int) -> tuple[str | None, int]:
    """After one line: the multi-line string still open, and the brackets still open (strings and comments left
    out)."""
    i = 0
    while i < len(line):
        if inside is not None:
            end = line.find(inside, i)
            if end < 0:
                return inside, depth
            i, inside = end + 3, None
            continue
        c = line[i]
        if line.startswith(_STRING_DELIMS, i):
            inside, i = line[i:i + 3], i + 3
        elif c in "\"'":
            i = _string_end(line, i)
        elif c == "#":
            break
        else:
            depth += {"[": 1, "]": -1}.get(c, 0)
            i += 1
    return inside, max(depth, 0)


def _string_end(line: str, start: int) -> int:
    quote, i = line[start], start + 1
    while i < len(line) and line[i] != quote:
        i += 2 if quote == '"' and line[i] == "\\" else 1
    return i + 1


def _last_key(lines: list[str], headers: list[tuple[int, str, bool]], k: int) -> int:
    """The last line of header k's own keys (before its subtables): where a key of its own goes."""
    start = headers[k][0]
    end = headers[k + 1][0] if k + 1 < len(headers) else len(lines)
    last = start
    for i in range(start + 1, end):
        if lines[i].strip() and not lines[i].lstrip().startswith("#"):
            last = i
    return last


def _region(headers: list[tuple[int, str, bool]], k: int, end: int) -> tuple[int, int]:
    """Lines of header k's table and its subtables ([step.on_rank.N] belongs to the [[step]] above it)."""
    start, name, _ = headers[k]
    for line, other, _ in headers[k + 1:]:
        if not other.startswith(name + "."):
            return start, line
    return start, end


def _replace(lines: list[str], start: int, end: int, key: str, value: Callable[[str], str | None],
             edits: dict[int, str], every: bool = False) -> bool:
    """Give `key`'s line(s) in lines[start:end] a new value; False when there is none."""
    pattern = re.compile(rf"^(\s*{key}\s*=\s*)([^#\n]*?)(\s*(#.*)?)(\n?)$")
    found = False
    for i in range(start, end):
        match = pattern.match(edits.get(i, lines[i]))
        if match:
            new = value(match.group(2))
            if new is not None:
                edits[i] = f"{match.group(1)}{new}{match.group(3)}{match.group(5)}"
            found = True
            if not every:
                break
    return found


def _number(literal: str, factor: float, floor: bool = False) -> str | None:
    try:
        value = tomllib.loads(f"v = {literal}")["v"]
    except tomllib.TOMLDecodeError:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if floor:
        own, _ = formats.legacy_deadline(value)
        return repr(float(own))  # type: ignore[arg-type]  # a number in, a number out
    return repr(round(value * factor, 6))


def render(done: Upgrade) -> list[str]:
    """The lines `meshsim run --upgrade` prints for one file."""
    if not done.changed:
        return [f"{done.path}: already in format {formats.CURRENT}; unchanged"]
    how = "ran once to learn its kind of hang" if done.ran else "the model alone, no cluster"
    return ([f"{done.path}: upgraded ({how})"] + [f"  {line}" for line in done.changes]
            + [f"  note: {line}" for line in done.notes] + [f"  warning: {line}" for line in done.warnings])


def upgrade_files(paths: list[str], run: Callable[[Scenario], Any], as_json: bool = False) -> int:
    """`meshsim run --upgrade FILE...`: every file is read first (a bad one is a ScenarioError, and nothing is
    written); exit 0 when each was upgraded faithfully (or was current), 1 when one has a warning to look at."""
    scenarios = {path: load(path) for path in paths}
    done = [upgrade(path, run if needs_run(sc) else None) for path, sc in scenarios.items()]
    if as_json:
        print(json.dumps([d.to_json() for d in done], indent=2))
    else:
        for d in done:
            print("\n".join(render(d)))
    return 1 if any(d.warnings for d in done) else 0


__all__ = ["Upgrade", "needs_run", "render", "upgrade", "upgrade_files", "ScenarioError"]
