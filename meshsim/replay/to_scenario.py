"""An incident as a meshsim scenario: the groups the job made, then every call each rank made, in its order.

A hang is reproduced by the per-group sequence of blocking calls and by which ranks make which, so the plan
is a common supersequence of the ranks' recorded calls: a step is one call (op, group, size, the line that
made it), and only_on / skip_on say which ranks made it; groups that one line calls on with no rank in common
are one step, each rank on its own group (on_rank). Each rank runs exactly its own recorded sequence, so the
replay hangs where the job hung, and removing a rank's divergence (a skip_on, an only_on step, a sleep) is the
fix to try. A rank without a dump that is gone makes the calls its peers completed with it, then exits; one
that is placed elsewhere (meshsim.replay.absent) makes the calls its peers prove it made, then goes on with
the program; a rank that stalled outside any collective sleeps past the deadline after its last call.

Flight Recorder does not record everything a plan op needs; what is replaced is said in the description:
roots of broadcast and scatter (src 0), all_gather's sizes (the plan's all_gather has none), ops the plan
language lacks (replayed as the nearest blocking call on the same group), point-to-point calls (a barrier of
the two ranks on a group of their own), and sizes beyond what a replay needs (large tensors keep their
equalities, not their sizes).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..scenario import formats
from .analyze import DEAD, MISMATCH, STALLED, Analysis
from .records import (
    COMPLETED,
    P2P,
    RETIRED,
    UNSEEN,
    WORLD_DESC,
    Call,
    Incident,
    _ranks_text,
)

BIG = 1 << 16  # elements: beyond this a replayed tensor only needs to be told apart from other sizes
STALL_S = 3600.0  # a stalled rank sleeps this long (or ten deadlines), far past any replay's deadline

# Flight Recorder op (without its backend) -> (plan op, which numel the plan takes, what is replaced)
OPS: dict[str, tuple[str, str | None, str | None]] = {}
for _op in ("all_reduce", "allreduce", "allreduce_coalesced", "all_reduce_coalesced", "_allreduce_base"):
    OPS[_op] = ("all_reduce", "in", None)
for _op in ("reduce", "_reduce_oop"):
    OPS[_op] = ("all_reduce", "in", "reduce (to one rank) is replayed as all_reduce: the same ranks block")
for _op in ("barrier", "all_reduce_barrier"):
    OPS[_op] = ("barrier", None, None)
for _op in ("broadcast", "_broadcast_oop"):
    OPS[_op] = ("broadcast", None, "broadcast's root is not recorded: replayed from group rank 0")
for _op in ("all_gather", "allgather", "_all_gather_base", "_allgather_base", "all_gather_into_tensor",
              "all_gather_into_tensor_coalesced", "allgather_into_tensor_coalesced", "ALLGATHER_coalesced",
              "all_gather_single", "allgather_coalesced", "all_gather_v"):
    OPS[_op] = ("all_gather", None, "all_gather is replayed with one element a rank (a plan's has no size)")
for _op in ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
              "REDUCE_SCATTER_coalesced", "reduce_scatter_single", "reduce_scatter_v", "reducescatter"):
    OPS[_op] = ("reduce_scatter", "out", None)
OPS["scatter"] = ("scatter", "out", "scatter's root is not recorded: replayed from group rank 0")
for _op in ("send", "recv"):
    OPS[_op] = ("barrier", None, "point-to-point send and recv are replayed as a barrier of the two ranks on a "
                                 "group of their own (a plan has no send or recv): each blocks until the other comes")
OPS["gather"] = ("all_gather", None, "gather (to one rank) is replayed as all_gather: the same ranks block")
for _op in ("all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall_base", "alltoall"):
    OPS[_op] = ("all_gather", None, "all_to_all is replayed as all_gather: every rank exchanges with every other")


@dataclass
class Step:
    token: tuple  # (role, plan op, numel, site)
    ranks: set[int] = field(default_factory=set)
    calls: dict[int, Call] = field(default_factory=dict)
    fault: dict | None = None  # a sleep or exit the replay adds, written as it is


@dataclass
class Replay:
    """The scenario as a TOML-ready table, with what had to be replaced to write it."""

    data: dict
    replaced: list[str]
    left_out: list[str]
    steps: list[Step]
    comments: list[str | None] = field(default_factory=list)  # one a step: what in the dumps it stands for

    def toml(self) -> str:
        return dumps(self.data, self.comments)

    def save(self, path: str) -> str:
        with open(path, "w") as f:
            f.write(self.toml())
        return path

    def scenario(self, path: str = "") -> Any:
        """Validated through meshsim's own scenario parser (ScenarioError if the plan is not valid)."""
        from ..scenario.files import parse

        return parse(self.data, path)


def to_scenario(incident: Incident, analysis: Analysis, deadline: float = 10.0, name: str | None = None) -> Replay:
    replaced: dict[str, None] = {}
    left_out: dict[str, None] = {}
    handles = _handles(incident)
    sizes = _SizeMap()
    programs = {}
    start = _common_start(incident)
    for rank in incident.dumped:
        calls = _replayed_calls(incident, rank, start, left_out)
        programs[rank] = [( _token(incident, c, replaced, sizes), c) for c in calls]
    steps = _merge(programs)
    plan: list[dict] = _creation_steps(incident, handles, steps)
    comments: list[str | None] = [None] * len(plan)
    _faults(incident, analysis, steps, deadline, replaced)  # before the tables: a dead rank joins steps
    _carry_on(incident, steps)
    plan += [s.fault if s.fault is not None else _step_table(incident, s, handles, sizes) for s in steps]
    comments += [_comment(s) for s in steps]
    crashed = any(c.kind == DEAD for c in analysis.causes)
    expect: dict[str, Any] = {"outcome": "crash" if crashed else "hang"}
    if analysis.culprits:
        expect["culprit_ranks"] = analysis.culprits
    lead = analysis.headline
    if lead is not None and not crashed and lead.group is not None:
        g = incident.groups[lead.group]
        if g.dim is not None and g.dim != UNSEEN and g.mesh is not None:
            mesh = incident.meshes[g.mesh]
            expect["mesh_dim"] = g.dim if mesh.named else list(mesh.names).index(g.dim)
    if sizes.scaled:
        replaced[f"tensor sizes above {BIG} elements are replayed as {BIG} + k (equal sizes stay equal, "
                 f"different ones stay different)"] = None
    data = {formats.KEY: formats.CURRENT,
            "name": name or _name(incident),
            "description": _description(incident, analysis, list(replaced), list(left_out)),
            "deadline": float(deadline),
            "topology": _topology(incident),
            "step": plan,
            "expect": expect}
    return Replay(data, list(replaced), list(left_out), steps, comments)


def _name(incident: Incident) -> str:
    base = os.path.basename(os.path.normpath(incident.directory)) or "incident"
    if base == "dumps":
        base = os.path.basename(os.path.dirname(os.path.normpath(incident.directory))) or base
    return "replay-" + re.sub(r"[^A-Za-z0-9_-]+", "-", base)


def _topology(incident: Incident) -> dict:
    """Hosts from the first mesh's innermost dim (what a host usually holds); one host when there is none."""
    per_host = incident.world
    if incident.meshes and len(incident.meshes[0].shape) > 1:
        inner = incident.meshes[0].shape[-1]
        if inner > 1 and incident.world % inner == 0:
            per_host = inner
    return {"hosts": incident.world // per_host, "devices_per_host": per_host}


def _handles(incident: Incident) -> dict:
    out: dict[Any, str] = {}
    for index in range(len(incident.meshes)):
        out[("mesh", index)] = "m" if len(incident.meshes) == 1 else f"m{index}"
    for key, g in incident.groups.items():
        if g.mesh is None and g.desc != WORLD_DESC:
            out[("group", key)] = "g" + re.sub(r"[^A-Za-z0-9]+", "_", key)
    return out


def _common_start(incident: Incident) -> dict[tuple, int]:
    """The first count every rank still holds, role by role (all groups of a mesh dim together): ring
    buffers that dropped different prefixes then start the replay at one place of the program, and a
    count that differs stays a difference."""
    start: dict[tuple, int] = {}
    for rec in incident.ranks.values():
        firsts: dict[tuple, int] = {}
        for c in rec.calls:
            role = incident.role(c.group)
            firsts[role] = min(firsts.get(role, c.seq), c.seq)
        for role, first in firsts.items():
            start[role] = max(start.get(role, 1), first)
    return start


def _replayed_calls(incident: Incident, rank: int, start: dict[tuple, int], left_out: dict) -> list[Call]:
    out = []
    for c in incident.ranks[rank].calls:
        role = incident.role(c.group)
        if c.seq < start[role]:
            left_out[f"calls on {incident.role_text(role)} before #{start[role]} (a rank's buffer had dropped "
                     f"them)"] = None
            continue
        out.append(c)
    return out


class _SizeMap:
    def __init__(self) -> None:
        self.big: dict[int, int] = {}
        self.scaled = False

    def __call__(self, numel: int) -> int:
        if 1 <= numel <= BIG:
            return numel
        self.scaled = True
        return self.big.setdefault(numel, BIG + 1 + len(self.big))


def _token(incident: Incident, call: Call, replaced: dict, sizes: _SizeMap) -> tuple:
    fallback = f"{call.op} has no plan op: replayed as a barrier on its group, the nearest blocking call"
    op, numel_from, note = OPS.get(call.op, ("barrier", None, fallback))
    if note:
        replaced[note] = None
    if call.p2p:  # a send and its receive come from different lines, and are one step: the route's k-th exchange
        return (incident.role(call.group), op, None, P2P)
    numel = None
    if numel_from == "in":
        numel = sizes(call.in_numel)
    elif numel_from == "out":
        numel = sizes(call.out_numel)
    return (incident.role(call.group), op, numel, call.site)


def _merge(programs: dict[int, list[tuple[tuple, Call]]]) -> list[Step]:
    """A common supersequence of every rank's program: equal programs once, the most common first, then
    each other one aligned to it (difflib's matching blocks), its unmatched calls as steps of its own."""
    unique: dict[tuple, list[int]] = {}
    for rank, program in sorted(programs.items()):
        unique.setdefault(tuple(t for t, _ in program), []).append(rank)
    plan: list[Step] = []
    for tokens, ranks in sorted(unique.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        calls_of = {r: [c for _, c in programs[r]] for r in ranks}
        matcher = difflib.SequenceMatcher(None, [s.token for s in plan], list(tokens), autojunk=False)
        merged: list[Step] = []
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag in ("delete", "replace"):
                merged.extend(plan[i1:i2])
            if tag == "equal":
                merged.extend(_join(plan[i1 + k], calls_of, j1 + k) for k in range(i2 - i1))
            if tag in ("insert", "replace"):
                merged.extend(_join(Step(tokens[j]), calls_of, j) for j in range(j1, j2))
        plan = merged
    return plan


def _join(step: Step, calls_of: dict[int, list[Call]], j: int) -> Step:
    """The ranks of one program make the step with their j-th call."""
    step.ranks.update(calls_of)
    for r, calls in calls_of.items():
        step.calls[r] = calls[j]
    return step


def _creation_steps(incident: Incident, handles: dict, steps: list[Step]) -> list[dict]:
    """The groups, made in the order the job made them (their names count up), each mesh by one
    init_device_mesh, and the default group as a 1-D mesh over the world (torch hands back the default
    group for it, making nothing new)."""
    out: list[dict] = []
    if any(s.token[0] == ("group", k) for s in steps for k, g in incident.groups.items() if g.desc == WORLD_DESC):
        out.append({"op": "init_device_mesh", "shape": [incident.world], "names": ["world"], "out": "world"})
    made_meshes: set[int] = set()
    for key, g in incident.groups.items():
        if g.mesh is not None:
            if g.mesh not in made_meshes:
                made_meshes.add(g.mesh)
                mesh = incident.meshes[g.mesh]
                table = {"op": "init_device_mesh", "shape": list(mesh.shape), "names": list(mesh.names),
                         "out": handles[("mesh", g.mesh)]}
                if not mesh.named:
                    del table["names"]  # as the job did: torch then names the groups mesh_dim_<i>
                out.append(table)
        elif g.desc != WORLD_DESC:
            out.append({"op": "new_group", "ranks": list(g.ranks), "out": handles[("group", key)]})
    return out


def _step_table(incident: Incident, step: Step, handles: dict, sizes: _SizeMap) -> dict:
    role, op, numel, _site = step.token
    table: dict[str, Any] = {"op": op}
    if role[0] == "mesh":
        mesh = incident.meshes[role[1]]
        table["mesh"] = handles[("mesh", role[1])]
        table["dim"] = role[2] if mesh.named else list(mesh.names).index(role[2])
        eligible = set(range(incident.world))
    elif incident.groups[role[1]].desc == WORLD_DESC:
        table["mesh"], table["dim"] = "world", "world"
        eligible = set(range(incident.world))
    else:
        part = incident.part(role)
        eligible = {r for g in part for r in g.ranks}  # the others are not members: the step does nothing there
        own = {r: g.key for g in part for r in g.ranks}
        first = own[min(step.ranks & eligible)] if step.ranks & eligible else part[0].key
        table["group"] = handles[("group", first)]
        # groups one line calls on with no rank in common: each rank makes the call on its own (one step, as one
        # line of the job's code, so that the judge sees one part of the program); every member says which, so
        # that dropping a skip_on makes a skipping rank make the call on its own group
        overrides = {str(r): {"group": handles[("group", own[r])]} for r in sorted(eligible) if own[r] != first}
        if overrides:
            table["on_rank"] = overrides
    if numel is not None:
        table["numel"] = numel
    _select(table, step.ranks, eligible, incident.world)
    return table


def _select(table: dict, ranks: set[int], eligible: set[int], world: int) -> None:
    if ranks >= eligible:
        return
    skipped = sorted(eligible - ranks)
    if len(skipped) <= len(ranks):
        table["skip_on"] = skipped
    else:
        table["only_on"] = sorted(ranks)


def _faults(incident: Incident, analysis: Analysis, steps: list[Step], deadline: float, replaced: dict) -> None:
    """Where ranks stop, as steps of their own:

    - a rank without a dump makes every call its peers completed with it, then exits before the first one
      they did not;
    - a rank that stalled sleeps past the deadline after its last call;
    - a rank whose call differs from its peers' only in sizes or dtypes sleeps in its place: NCCL hangs on
      such a call, but gloo, where replays run, aborts a rank or returns wrong sums instead (finding
      gloo-size-mismatch-silent), so the replay keeps where the rank was held, not what it passed.
    """
    seconds = min(max(STALL_S, 10 * deadline), 86400.0)
    for cause in analysis.causes:
        if cause.kind != MISMATCH or not _sizes_only(incident, cause):
            continue
        for index, step in enumerate(steps):
            call = step.calls.get(cause.rank)
            if call is not None and call.group == cause.group and call.seq == cause.seq:
                step.ranks.discard(cause.rank)
                del step.calls[cause.rank]
                steps.insert(index, Step(("fault",), {cause.rank}, fault={"op": "sleep", "seconds": seconds,
                                                                          "only_on": [cause.rank]}))
                if not step.ranks:
                    steps.remove(step)
                replaced[f"rank {cause.rank}'s {call.op} of other sizes than its peers' is replayed as a sleep in "
                         f"its place: gloo, where replays run, does not hang on it as NCCL does (it aborts a rank "
                         f"or returns wrong sums: finding gloo-size-mismatch-silent)"] = None
                break
    dead = {c.rank for c in analysis.causes if c.kind == DEAD}
    for m in incident.missing:
        absent = incident.absent.get(m)
        if absent is None or absent.gone or m in dead:
            _exit_where_it_stopped(incident, steps, m)
        else:
            _make_proven_calls(incident, steps, {(c.group, c.seq) for c in absent.proven}, m)
    for r in sorted({c.rank for c in analysis.causes if c.kind == STALLED}):
        last = max((i for i, s in enumerate(steps) if r in s.ranks), default=-1)
        steps.insert(last + 1, Step(("fault",), {r}, fault={"op": "sleep", "seconds": seconds, "only_on": [r]}))


def _sizes_only(incident: Incident, cause: Any) -> bool:
    """Whether the culprit's call has the others' op, with other sizes or dtypes."""
    mine = incident.ranks[cause.rank].at(cause.group, cause.seq)
    others = [incident.ranks[m].at(cause.group, cause.seq) for m in incident.groups[cause.group].ranks
              if m != cause.rank and incident.ranks[m].dumped]
    return mine is not None and any(o is not None and o.op == mine.op for o in others)


def _carry_on(incident: Incident, steps: list[Step]) -> None:
    """After its last recorded call a rank goes on with the program: a rank held in a call never gets
    further in the replay either, a stalled or dead one is stopped by its sleep or exit, and once a fix
    removes the divergence every rank makes the same calls, so the fixed replay finishes."""
    for rank in range(incident.world):
        last = max((i for i, s in enumerate(steps) if rank in s.ranks), default=-1)
        for step in steps[last + 1:]:
            if step.fault is not None:
                continue
            role = step.token[0]
            if role[0] == "mesh" or any(rank in g.ranks or g.desc == WORLD_DESC for g in incident.part(role)):
                step.ranks.add(rank)


def _exit_where_it_stopped(incident: Incident, steps: list[Step], m: int) -> None:
    """A rank that is gone makes every call its peers completed with it, then exits before the first one
    they did not."""
    position = len(steps)
    for index, step in enumerate(steps):
        done = None if step.fault is not None else _completed_with(incident, step, m)
        if done is None:
            continue  # the call is not on a group of m's
        if not done:
            position = index
            break
        step.ranks.add(m)
    steps.insert(position, Step(("fault",), {m}, fault={"op": "exit", "code": 1, "only_on": [m]}))


def _make_proven_calls(incident: Incident, steps: list[Step], proven: set[tuple[str, int]], m: int) -> None:
    """A rank without a dump that is taken to be alive makes the calls its peers prove it made (and none that
    they show it went past); after them it goes on with the program (_carry_on), as its twins do."""
    for step in steps:
        if step.fault is None and any((c.group, c.seq) in proven for r, c in step.calls.items()
                                      if m in incident.groups[c.group].ranks):
            step.ranks.add(m)


def _completed_with(incident: Incident, step: Step, m: int) -> bool | None:
    """Whether m's group in this step's role completed the call with the dumped members that made it;
    None when the step is not on a group of m's."""
    mine = [g for g in incident.part(step.token[0]) if m in g.ranks]
    if not mine:
        return None
    peers = [r for r in step.calls if r in mine[0].ranks and r != m]  # ranks with a dump that made the call
    if not peers:
        return None
    return all(step.calls[r].state in (COMPLETED, RETIRED) for r in peers)


def _description(incident: Incident, analysis: Analysis, replaced: list[str], left_out: list[str]) -> str:
    library = f", {incident.comm_lib_version}" if incident.comm_lib_version else ""
    missing = f"; no dump from ranks {_ranks_text(incident.missing)}" if incident.missing else ""
    source = (f"Replayed from {len(incident.dumped)} Flight Recorder dumps in {incident.directory} (format "
              f"{incident.version}, {incident.backend}{library}; world {incident.world}{missing}).")
    lines = [source]
    for mesh in incident.meshes:
        lines.append(f"Mesh {tuple(mesh.shape)} with dims {list(mesh.names)}, from its groups' descriptions "
                     f"(mesh_<dim>) and names.")
    lines.append(f"Diagnosis from the dumps: {analysis.summary}")
    for cause in analysis.causes[1:]:
        lines.append(f"Also: {cause.text}.")
    lines.append("Each step is a call the ranks made, in the order they made it; only_on / skip_on say which "
                 "ranks made it, so every rank replays its own recorded calls. Fix the divergent rank (drop its "
                 "skip_on, its only_on step, its sleep or exit) and `meshsim run` this file: the hang goes away.")
    if replaced:
        lines.append("Replaced: " + "; ".join(replaced) + ".")
    if left_out:
        lines.append("Left out: " + "; ".join(left_out) + ".")
    for note in incident.notes:
        lines.append(f"Note: {note}.")
    return "\n".join(lines)


def _comment(step: Step) -> str | None:
    """What the dumps recorded for this step: the op as Flight Recorder named it, where, and which call of
    its group it was on the ranks that made it."""
    if step.fault is not None or not step.calls:
        return None
    calls = list(step.calls.values())
    ops = sorted({"+".join(c.ops) if c.ops else c.op for c in calls})
    seqs = sorted({c.seq for c in calls})
    count = f"#{seqs[0]}" if len(seqs) == 1 else f"#{seqs[0]}-{seqs[-1]}"
    site = calls[0].site or "an unknown line"
    return f"recorded: {', '.join(ops)} {count} on its group, at {site}"


def dumps(data: dict, comments: list[str | None] | None = None) -> str:
    """The scenario as TOML a person reads: one line a field, lists inline, the description as a block.
    Only what to_scenario writes (strings, numbers, lists of them, the topology, steps, expect)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v, ensure_ascii=False)  # a JSON string is a TOML basic string
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):  # an inline table (on_rank's overrides)
            return "{ " + ", ".join(f"{json.dumps(str(k))} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(f"no TOML for {type(v).__name__}")

    def block(text: str) -> str:
        escaped = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        return '"""\n' + escaped + '"""'

    lines = [f"{formats.KEY} = {formats.CURRENT}",  # the rules it is read by (meshsim.scenario.formats)
             f"name = {value(data['name'])}", f"description = {block(data['description'])}",
             f"deadline = {value(data['deadline'])}", "", "[topology]"]
    lines += [f"{k} = {value(v)}" for k, v in data["topology"].items()]
    for index, step in enumerate(data["step"]):
        comment = comments[index] if comments and index < len(comments) else None
        lines += [""] + ([f"# {comment}"] if comment else []) + ["[[step]]"]
        lines += [f"{k} = {value(v)}" for k, v in step.items()]
    lines += ["", "[expect]"] + [f"{k} = {value(v)}" for k, v in data["expect"].items()]
    return "\n".join(lines) + "\n"
