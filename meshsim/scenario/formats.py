"""Which rules a scenario file is read by: the `format` it names, and the rules of each format.

A file says which format it is written in with a top-level key, `format = 2`; every file meshsim saves names the
current one. A file without it was written for meshsim 0.2 (or saved by 0.3, which wrote none) and is read as 0.2
meant it, format 1:

- a step that raises is an observation like any other: it fails the run only where torch and the model disagree
  (format 2: a step that raises must say `expect_error = true`, else the run fails, since that is most often a
  misspelt name or handle). In format 1 `expect_error` only lets a step name ranks or a mesh beyond the world, as
  in 0.2, and the steps that raise are named only to explain a run that fails for another reason;
- `[expect] kind` names one of 0.2's eight kinds of hang, which today's diagnosis tells apart more finely: it
  matches every kind of today's that 0.2 called by that name (KIND_FAMILIES);
- a deadline under 1 s (0.2 took 50 ms; 0.3 refuses it: it cannot tell a hang from a loaded machine) is read as
  1 s, with every `sleep` stretched alike, so a straggler stays within or past the deadline as it was.
Op names, fields, their defaults and the [expect] keys did not change between 0.2 and 0.3 (0.3 only added ops
and fields). `meshsim run --upgrade FILE` rewrites a format 1 file in format 2 (meshsim.scenario.upgrade).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from ..core import deadlines
from ..core.errors import InputError
from ..judge.diagnose import KINDS

KEY = "format"
CURRENT = 2
LEGACY = 1  # the format of every file that names none
FORMATS = {1: "meshsim 0.2", 2: "meshsim 0.3"}  # the format -> the release whose rules it keeps
LEGACY_MIN_DEADLINE_S = 0.05  # what 0.2 took (its deadlines.MIN_S)

_COLLECTIVES = frozenset(KINDS[k] for k in ("skipped", "reordered", "mismatched", "left", "size"))
_CREATION = frozenset(KINDS[k] for k in ("inconsistent", "subset", "collision"))
# 0.2's kind -> today's kinds it covers. 0.2 told a dead rank, a raise, a straggler, a hang in group creation and
# a hang in collectives apart from what the record showed; within the last two, its own heuristics picked the
# name (0.3 reads the ranks' per-group call sequences: scenario 05's "reordered" is a skip there). 0.2 had no
# kind for sizes that differ: it named such a hang by how it ended (a rank gloo killed, a straggler, a skip).
KIND_FAMILIES: dict[str, frozenset[str]] = {
    KINDS["dead"]: frozenset({KINDS["dead"], KINDS["size"]}),
    KINDS["raised"]: frozenset({KINDS["raised"]}),
    KINDS["straggler"]: frozenset({KINDS["straggler"], KINDS["size"]}),
    KINDS["unknown"]: frozenset({KINDS["unknown"]}),
    KINDS["inconsistent"]: _CREATION,
    KINDS["subset"]: _CREATION,
    KINDS["reordered"]: _COLLECTIVES,
    KINDS["skipped"]: _COLLECTIVES,
}


class FormatError(InputError):
    """A `format` this meshsim cannot read (the scenario loader names the file)."""


def of(data: Mapping[str, Any]) -> int:
    """The format a scenario's table is written in (LEGACY when it names none)."""
    if KEY not in data:
        return LEGACY
    value = data[KEY]
    if type(value) is not int:
        raise FormatError(f"format must be a format number ({_known()}), got {value!r}")
    if value > CURRENT:
        raise FormatError(f"format {value} is newer than this meshsim reads ({_known()}): upgrade meshsim")
    if value not in FORMATS:
        raise FormatError(f"format {value} is not a scenario format ({_known()})")
    return value


def _known() -> str:
    return ", ".join(f"{n} for {release}" for n, release in FORMATS.items())


def kind_matches(expected: str, seen: str, format: int) -> bool:
    """Whether a diagnosis of kind `seen` is what a file of this format means by `expected`."""
    if format == LEGACY and expected in KIND_FAMILIES:
        return seen in KIND_FAMILIES[expected]
    return seen == expected


def legacy_deadline(deadline: object) -> tuple[object, float]:
    """A format 1 deadline as this meshsim runs it, and the factor every sleep is stretched by (1.0: none).
    A value 0.2 refused is returned as it is, for the loader to refuse."""
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
        return deadline, 1.0
    if LEGACY_MIN_DEADLINE_S <= deadline < deadlines.MIN_S:
        return deadlines.MIN_S, deadlines.MIN_S / deadline
    return deadline, 1.0


def stretch_sleeps(steps: Any, factor: float) -> Any:
    """The [[step]] tables with every sleep's seconds (and its per-rank overrides) times `factor`."""
    if factor == 1.0 or not isinstance(steps, list):
        return steps
    out = []
    for table in steps:
        if isinstance(table, dict) and table.get("op") == "sleep":
            table = _stretched(table, factor)
            if isinstance(table.get("on_rank"), dict):
                table["on_rank"] = {r: _stretched(o, factor) for r, o in table["on_rank"].items()}
        out.append(table)
    return out


def _stretched(table: Any, factor: float) -> Any:
    seconds = table.get("seconds") if isinstance(table, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return table  # nothing to stretch, or a value validation refuses
    return {**table, "seconds": round(seconds * factor, 6)}


def hint(path: str, format: int) -> str:
    """The one line a report of an older file carries."""
    where = f" {shlex.quote(path)}" if path else " FILE"
    return (f"written in format {format} ({FORMATS[format]}'s rules{', no `format` key' if format == LEGACY else ''}"
            f"): `meshsim run --upgrade{where}` rewrites it in format {CURRENT}")
