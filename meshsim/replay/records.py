"""The records a set of Flight Recorder dumps is rebuilt into: calls, ranks, groups, meshes, the incident, and
the program order their calls follow. meshsim.replay.incident builds them; meshsim.replay.absent places the ranks
the dumps do not show; analyze, to_scenario and the report read them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..core.ranks import ranks_text
from ..judge.blame import ProgramOrder as _VotedOrder

COMPLETED = "completed"
IN_FLIGHT = "in flight"  # issued, not finished: the rank waits in it (NCCL: started or scheduled)
TIMED_OUT = "timed out"  # NCCL: retired by the watchdog without completing
FAILED = "failed"  # gloo: retired while a member never issued it, so it ended in an error, not a result
RETIRED = "retired"  # gloo: finished, and gloo does not record whether with a result or an error
UNFINISHED = (IN_FLIGHT, TIMED_OUT, FAILED)  # the rank was held up in the call, whatever ended it

WORLD_DESC = "default_pg"
UNSEEN = "unseen"  # a mesh dim whose groups recorded no call: its size shows, its name does not
P2P_OPS = ("send", "recv")
P2P = "p2p"  # the source of a pair's group: each pair of ranks that sent to each other on a group is one


@dataclass(frozen=True)
class Call:
    rank: int
    group: str  # the group's key in Incident.groups
    seq: int  # Flight Recorder's collective_seq_id: the group's count of collectives, from 1
    op: str  # Flight Recorder's name without its backend: all_reduce, _reduce_scatter_base, ...
    in_sizes: tuple
    out_sizes: tuple
    in_dtypes: tuple
    out_dtypes: tuple
    state: str
    fr_state: str  # as the dump wrote it: scheduled, started, completed
    site: str | None  # the innermost frame outside torch, as file.py:LINE
    record_id: int
    time_ns: int
    ops: tuple[str, ...] = ()  # every op of a coalesced call, its closing "coalesced" marker left out
    p2p: bool = False
    peer: str = ""  # a p2p op's "0->1"
    frames: tuple = ()  # (name, filename, line), innermost first, as recorded
    timeout_ms: int = 0  # how long its group lets it wait (0: not recorded)
    op_id: int = 0  # the group's count of every op the rank made on it, recorded or not (0: not recorded)
    via: str | None = None  # the user's frame that called the one at `site` (meshsim.compat.progress.user_sites)

    @property
    def finished(self) -> bool:
        return self.state not in UNFINISHED

    @property
    def in_numel(self) -> int:
        return sum(_numel(s) for s in self.in_sizes)

    @property
    def out_numel(self) -> int:
        return sum(_numel(s) for s in self.out_sizes)

    def signature(self) -> tuple:
        """What members of a group must agree on for the collective to match (torch's analyzer checks these); a
        send and its receive match on sizes and dtypes."""
        op = P2P if self.p2p else self.op
        return (op, self.in_sizes, self.out_sizes, tuple(self.in_dtypes), tuple(self.out_dtypes))

    def describe(self, groups: dict[str, Group] | None = None) -> str:
        where = f" at {self.site}" if self.site else ""
        on = groups[self.group].describe() if groups and self.group in groups else f"group {self.group}"
        sizes = "x".join(map(str, self.in_sizes[0])) if len(self.in_sizes) == 1 and self.in_sizes[0] else ""
        what = f"{self.op}" + (f" of {sizes} {self.in_dtypes[0]}" if sizes and self.in_dtypes else "")
        return f"{what} #{self.seq} on {on}{where}"


@dataclass
class RankRecord:
    rank: int
    file: str | None  # None: this rank left no dump
    calls: list[Call] = field(default_factory=list)  # in the order the rank made them (record_id)
    wrapped: bool = False  # its buffer had dropped older calls
    pg_ids: dict[int, str] = field(default_factory=dict)  # pg_id (the rank's count of its groups) -> group key
    status: dict = field(default_factory=dict)  # pg_status as dumped, by pg_id
    pg_id_of: dict[str, int] = field(default_factory=dict)  # group key -> pg_id, seen or inferred

    def __post_init__(self) -> None:
        self._index: dict[str, dict[int, Call]] | None = None  # group -> seq -> call, built on first use
        self._held: tuple[Call | None] | None = None
        self._issued: dict[str, int | None] = {}

    @property
    def dumped(self) -> bool:
        return self.file is not None

    def replace(self, index: int, call: Call) -> None:
        self.calls[index] = call
        self._index, self._held, self._issued = None, None, {}

    def set_calls(self, calls: list[Call]) -> None:
        self.calls = calls
        self._index, self._held, self._issued = None, None, {}

    def _by_group(self) -> dict[str, dict[int, Call]]:
        if self._index is None:
            self._index = {}
            for c in self.calls:
                self._index.setdefault(c.group, {})[c.seq] = c
        return self._index

    def on(self, group: str) -> list[Call]:
        return sorted(self._by_group().get(group, {}).values(), key=lambda c: c.seq)

    def issued(self, group: str) -> int | None:
        """How many collectives the rank issued on `group`; None when its dump cannot tell."""
        if not self.dumped:
            return None
        if group not in self._issued:
            self._issued[group] = self._count(group)
        return self._issued[group]

    def _count(self, group: str) -> int | None:
        seqs = list(self._by_group().get(group, {}))
        # pg_status counts every call of the group, also those the ring buffer has dropped
        status = self.status.get(str(self.pg_id_of.get(group)), {}) if group in self.pg_id_of else {}
        enqueued = status.get("last_enqueued_collective") if isinstance(status, dict) else None
        if isinstance(enqueued, int) and enqueued >= 0:
            seqs.append(enqueued)
        if seqs:
            return max(seqs)
        return None if self.wrapped and group not in self.pg_id_of else 0

    def at(self, group: str, seq: int) -> Call | None:
        return self._by_group().get(group, {}).get(seq)

    @property
    def last(self) -> Call | None:
        """The rank's last recorded call."""
        return self.calls[-1] if self.calls else None

    @property
    def held(self) -> Call | None:
        """The call that holds the rank up: its oldest unfinished one (NCCL may have queued more behind it)."""
        if self._held is None:
            self._held = (next((c for c in self.calls if not c.finished), None),)
        return self._held[0]

    @property
    def queued(self) -> list[Call]:
        held = self.held
        return [c for c in self.calls if held is not None and c.record_id > held.record_id and not c.finished]


@dataclass
class Group:
    key: str
    name: str  # torch's group name (pg_config's key, process_group[0] of the entries)
    desc: str  # its description: default_pg, mesh_<dim>, a user's group_desc, or "undefined"
    ranks: tuple[int, ...]
    source: str  # how the members are known: pg_config, mesh, calls, calls+pg_id
    mesh: int | None = None  # index in Incident.meshes
    dim: str | None = None
    route: tuple[int, int] | None = None  # a point-to-point group's (sender, receiver)

    @property
    def complete(self) -> bool:
        return self.source in ("pg_config", "mesh", "world", P2P)

    def describe(self) -> str:
        members = _ranks_text(self.ranks)
        if self.route is not None:
            return f"point-to-point {self.route[0]}->{self.route[1]} of group {self.name}"
        if self.dim is not None:
            return f"mesh dim {self.dim!r} group {members}"
        if self.desc == WORLD_DESC:
            return f"the default group (world {members})"
        label = "" if self.desc in ("undefined", "") else f" {self.desc!r}"
        return f"group {self.name}{label} {members}"


@dataclass
class Mesh:
    shape: tuple[int, ...]
    names: tuple[str, ...]
    named: bool  # False: torch named the dims dim_0, dim_1, ... (init_device_mesh without mesh_dim_names)
    groups: dict[str, list[str]]  # dim -> group keys in the order torch made them

    def coordinate(self, rank: int) -> list[int]:
        out = []
        for size in reversed(self.shape):
            out.append(rank % size)
            rank //= size
        return out[::-1]


@dataclass
class Incident:
    directory: str
    version: str
    backend: str
    comm_lib_version: str
    world: int
    ranks: dict[int, RankRecord]
    groups: dict[str, Group]
    meshes: list[Mesh]
    listing: list[int]  # the ranks in the order their files were listed
    notes: list[str] = field(default_factory=list)
    absent: dict[int, Any] = field(default_factory=dict)  # rank without a dump -> meshsim.replay.absent.Absent
    siblings: dict[str, str] = field(default_factory=dict)  # group -> the first of the groups it plays a part with
    unrecorded: dict[int, Call] = field(default_factory=dict)  # rank -> the call it is held in before its entry

    @property
    def missing(self) -> list[int]:
        return sorted(r for r, rec in self.ranks.items() if not rec.dumped)

    @property
    def dumped(self) -> list[int]:
        return sorted(r for r, rec in self.ranks.items() if rec.dumped)

    def role(self, group: str) -> tuple:
        """Groups that play one part in the program: every group of one mesh dim, groups that one line of code
        calls on with no rank in common (meshsim.judge.blame.sibling_parts), else the group itself."""
        g = self.groups[group]
        if g.mesh is not None:
            return ("mesh", g.mesh, g.dim)
        if group in self.siblings:
            return ("siblings", self.siblings[group])
        return ("group", group)

    def part(self, role: tuple) -> list[Group]:
        """The groups that play `role`."""
        return [g for g in self.groups.values() if self.role(g.key) == role]

    def role_text(self, role: tuple) -> str:
        if role[0] == "mesh":
            return f"mesh dim {role[2]!r}"
        if role[0] == "siblings":
            return "groups " + ", ".join(g.describe().removeprefix("group ") for g in self.part(role))
        return self.groups[role[1]].describe()

    def groups_of(self, rank: int) -> list[Group]:
        return [g for g in self.groups.values() if rank in g.ranks]


def _numel(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _ranks_text(ranks: Iterable[int]) -> str:
    """The replay's way to write ranks: meshsim.core.ranks.ranks_text in brackets, "[0-3, 5]"."""
    return "[" + ranks_text(ranks).replace(",", ", ") + "]"


def _replace(call: Call, **changes: Any) -> Call:
    from dataclasses import replace

    return replace(call, **changes)


class ProgramOrder(_VotedOrder):
    """The program order of an incident's dumped ranks (meshsim.judge.blame.ProgramOrder: by majority vote); a
    call is named by its group's role and its count on the group."""

    def __init__(self, incident: Incident):
        self.incident = incident
        super().__init__([self.key(c) for c in record.calls]
                         for record in incident.ranks.values() if record.dumped)

    def key(self, call: Call) -> tuple:
        return (self.incident.role(call.group), call.seq)
