"""torch's own Flight Recorder analyzer (torch.distributed.flight_recorder, `torchfrtrace`) on the same dumps.

It is run in-process through its Python API (build_db, the function `torchfrtrace` calls), as torch ships it:
first on the dumps as they are, as a user would run it; where that fails only because a dump lacks what
the analyzer needs (gloo's empty pg_config, a missing rank), again with meshsim's rebuilt groups filled in
and --allow-incomplete-ranks, to compare answers. It is also run with the files in other orders, because it
matches collectives "starting arbitrarily with the trace from the first rank" (builder.py), which is the
order the directory lists them in.

What it answers is read from its database: collectives it flags with missing ranks (`missing_ranks`) and
those with mismatches, whose `mismatch_collectives` it keys by the rank it calls "Culprit rank".
"""

from __future__ import annotations

import copy
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from .records import Incident


@dataclass
class Flag:
    group: str
    desc: str
    seq: int
    op: str
    missing: list[int]
    culprits: dict[int, str]  # rank -> torch's MatchInfo, as it prints it

    def to_json(self) -> dict:
        return {"group": self.group, "desc": self.desc, "seq": self.seq, "op": self.op, "missing": self.missing,
                "culprits": {str(r): m for r, m in sorted(self.culprits.items())}}


@dataclass
class TorchAnswer:
    available: bool
    as_dumped: str  # what happened on the dumps as they are: "ran", or the exception in one line
    filled: list[str] = field(default_factory=list)  # what had to be given to it to run at all
    failed: str | None = None  # it could not run even then
    flags: list[Flag] = field(default_factory=list)  # in the listing order of the files
    by_order: dict[str, tuple] = field(default_factory=dict)  # order name -> answer
    orders_left: int = 0  # file orders not tried: the time given to the comparison ran out

    @property
    def culprits(self) -> list[int]:
        return sorted({r for f in self.flags for r in f.culprits})

    @property
    def missing(self) -> list[int]:
        return sorted({r for f in self.flags for r in f.missing})

    @property
    def kinds(self) -> list[str]:
        """The kinds of mismatch it reports (its MatchState names), and "missing ranks" when it lists some."""
        found = {text.split(",")[0].removeprefix("Error type: ") for f in self.flags for text in f.culprits.values()}
        return sorted(found) + (["missing ranks"] if self.missing else [])

    @property
    def order_dependent(self) -> bool:
        return len(set(self.by_order.values())) > 1

    def answer(self) -> str:
        """In words: the culprits it names, else the missing ranks it lists."""
        if not self.available:
            return "not available in this torch"
        if self.failed is not None:
            return f"fails: {self.failed}"
        if self.culprits:
            kinds = ", ".join(k for k in self.kinds if k != "missing ranks")
            return f"names culprit rank{'s' if len(self.culprits) > 1 else ''} {self.culprits} ({kinds})"
        if self.missing:
            groups = sorted({f.group for f in self.flags if f.missing})
            return f"names no culprit; lists missing ranks {self.missing} on {len(groups)} group(s)"
        return "finds nothing wrong"

    def to_json(self) -> dict:
        return {"available": self.available, "as_dumped": self.as_dumped, "filled_in": self.filled,
                "failed": self.failed,
                "culprits": self.culprits, "missing": self.missing, "kinds": self.kinds, "answer": self.answer(),
                "flags": [f.to_json() for f in self.flags], "order_dependent": self.order_dependent,
                "answers_by_order": {k: {"culprits": list(v[0]), "missing": list(v[1])}
                                     for k, v in self.by_order.items()},
                "orders_not_tried": self.orders_left}


def run_torch(dumpset: Any, incident: Incident, shuffles: int = 3, budget_s: float = 20.0) -> TorchAnswer:
    """torch's answer on the dumps, and on the same dumps listed in other orders for as long as `budget_s` allows
    (its analyzer takes seconds a run on hundreds of ranks: 1,024 ranks took 196 s for 19 orders here)."""
    began = time.monotonic()
    try:
        with _quiet():  # its import warns that tabulate is missing
            from torch.distributed.flight_recorder.components.builder import build_db
            from torch.distributed.flight_recorder.components.config_manager import (
                JobConfig,
            )
    except ImportError:
        return TorchAnswer(False, "this torch has no torch.distributed.flight_recorder")
    details = {_base(d.path): {"host_name": f"host_rank{d.rank}", "rank": d.rank, "entries": d.entries,
                               "version": d.version, "pg_config": d.pg_config} for d in dumpset.dumps}
    plain = JobConfig().parse_args([dumpset.directory])
    with _quiet():
        db, error = _build(build_db, details, plain, dumpset.version)
    answer = TorchAnswer(True, "ran" if error is None else error)
    if error is not None:
        if not _configured(dumpset):
            answer.filled.append("pg_config rebuilt by meshsim (gloo's dumps have none)")
            details = _with_groups(details, incident)
        if incident.missing:
            answer.filled.append("--allow-incomplete-ranks (ranks without a dump)")
        args = JobConfig().parse_args([dumpset.directory] + (["--allow-incomplete-ranks"] if incident.missing else []))
        with _quiet():
            db, again = _build(build_db, details, args, dumpset.version)
        if again is not None:
            answer.failed = again
            return answer
    else:
        args = plain
    answer.flags = _flags(db)
    orders = {"as listed": list(details)}
    orders["by rank"] = sorted(details, key=lambda k: details[k]["rank"])
    orders["reversed"] = orders["by rank"][::-1]
    for d in sorted(dumpset.dumps, key=lambda d: d.rank)[:16]:
        # it matches each group's collectives from the first listed rank that has them: try each rank first
        # (the first 16 of a larger world: each try rebuilds its whole database)
        first = _base(d.path)
        orders[f"rank {d.rank} first"] = [first] + [k for k in orders["by rank"] if k != first]
    rng = random.Random(0)
    for i in range(shuffles):
        shuffled = list(details)
        rng.shuffle(shuffled)
        orders[f"shuffle {i}"] = shuffled
    for index, (name, keys) in enumerate(orders.items()):
        if index >= 2 and time.monotonic() - began > budget_s:  # as listed and by rank, always
            answer.orders_left = len(orders) - index
            break
        with _quiet():
            other, failed = _build(build_db, {k: details[k] for k in keys}, args, dumpset.version)
        flags = _flags(other) if failed is None else []
        answer.by_order[name] = (tuple(sorted({r for f in flags for r in f.culprits})),
                                 tuple(sorted({r for f in flags for r in f.missing}))) if failed is None \
            else (("fails",), (failed,))
    return answer


def _base(path: str) -> str:
    import os

    return os.path.basename(path)


def _configured(dumpset: Any) -> bool:
    return any(any(str(k) for k in d.pg_config) for d in dumpset.dumps)


def _with_groups(details: dict, incident: Incident) -> dict:
    out = {}
    for key, detail in details.items():
        rank = detail["rank"]
        config = {g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(g.ranks))}
                  for g in incident.groups.values() if rank in g.ranks}
        out[key] = dict(detail, pg_config=config)
    return out


def _build(build_db: Any, details: dict, args: Any, version: str) -> tuple[Any, str | None]:
    try:
        return build_db(copy.deepcopy(details), args, version), None  # it pops entries as it matches them
    except SystemExit as exc:
        return None, f"SystemExit: {exc}"
    except Exception as exc:  # noqa: BLE001 - its failures on odd dumps are part of its answer
        return None, f"{type(exc).__name__}: {str(exc)[:160]}"


def _flags(db: Any) -> list[Flag]:
    flags = []
    for c in db.collectives:
        missing = sorted(c.missing_ranks or ())
        culprits = {int(r): str(m.type_of_mismatch) for r, m in (c.mismatch_collectives or {}).items()}
        if missing or culprits:
            flags.append(Flag(str(c.group_id), str(c.pg_desc), int(c.collective_seq_id), str(c.collective_name),
                              missing, culprits))
    return flags


class _quiet:
    """torch's analyzer logs every mismatch at INFO through its own handler; the comparison shows its answer."""

    def __enter__(self) -> None:
        # `disabled`, not the level: its logger sets its own level when first made (at import)
        self.logger = logging.getLogger("Flight Recorder")
        self.was = self.logger.disabled
        self.logger.disabled = True

    def __exit__(self, *exc: object) -> None:
        self.logger.disabled = self.was
