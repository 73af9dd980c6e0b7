"""The world a set of Flight Recorder dumps describes: its ranks, groups, meshes, and each rank's calls.

Pure Python, no torch: it takes the dumps as read (meshsim.replay.dumps) and answers what the job was
when it hung. What the dumps do not say is stated in `notes`, never guessed silently:

- gloo records a group before it is named, so its dumps carry no pg_config (one empty entry): a group's
  members are then the ranks that recorded calls on it, completed where DeviceMesh's naming tells the rest
  (a mesh's groups are made dim after dim, one new_group per group, with consecutive names and the
  description mesh_<dim>) or where a rank's pg_id (it counts the groups a rank is a member of) shows it was
  a member of a group it never used;
- a rank without a dump is listed as such and never counted as having arrived anywhere;
- a ring buffer that wrapped loses a rank's oldest calls: per-group sequence numbers still count them.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
from collections import Counter
from typing import Any

from ..core.wire import ROOTED
from .dumps import ReplayError
from .meshes import meshes_and_world, name_order
from .records import (
    COMPLETED,
    FAILED,
    IN_FLIGHT,
    P2P,
    P2P_OPS,
    RETIRED,
    TIMED_OUT,
    WORLD_DESC,
    Call,
    Group,
    Incident,
    ProgramOrder,
    RankRecord,
    _numel,
    _ranks_text,
    _replace,
)
from .siblings import complete_by_creation_order, complete_siblings


def build(dumpset: Any, world: int | None = None) -> Incident:
    """The incident the dumps describe (a meshsim.replay.dumps.DumpSet, or any object with `.dumps`)."""
    dumps = list(dumpset.dumps)
    if not dumps:
        raise ReplayError(f"{getattr(dumpset, 'directory', '?')}: no dumps")
    version = dumps[0].version
    notes: list[str] = []
    raw_groups, configured = _groups_seen(dumps)
    _one_world(dumps, raw_groups, configured)
    key_of = _group_keys(raw_groups, configured, dumps)
    ranks: dict[int, RankRecord] = {}
    backends: Counter = Counter()
    for dump in dumps:
        ranks[dump.rank] = _rank_record(dump, key_of, backends)
    backend = backends.most_common(1)[0][0] if backends else "unknown"
    size = max(ranks) + 1
    for members in configured.values():
        for ranks_ in members:
            size = max(size, max(ranks_, default=-1) + 1)
    if world is not None:
        if world < size:
            raise ReplayError(f"{dumpset.directory}: world {world} given, but the dumps name rank {size - 1}")
        size = world
    groups = _initial_groups(raw_groups, configured, key_of, ranks, size)
    meshes, size = meshes_and_world(groups, size, notes, fixed=bool(configured) or world is not None)
    for g in groups.values():
        if g.source == "world":
            g.ranks = tuple(range(size))
    _members_from_pg_ids(groups, ranks, notes)
    _pg_ids_from_members(groups, ranks)
    _pair_p2p(groups, ranks)
    for rank in range(size):
        ranks.setdefault(rank, RankRecord(rank, None))
    missing = [r for r in range(size) if not ranks[r].dumped]
    if missing:
        notes.append(f"no dump from rank{'s' if len(missing) > 1 else ''} {_ranks_text(missing)}: a missing file "
                     f"does not say whether a rank died, exited, could not write it or lost it, so each is placed "
                     f"from its peers' dumps, and never counted as having arrived anywhere it is not shown to")
    if not configured and world is None:
        notes.append(f"gloo dumps name no group members, so the world is taken as {size} (ranks 0 to the highest "
                     f"rank a dump or a mesh names); a missing rank above that cannot be seen")
    for g in groups.values():
        if not g.complete:
            notes.append(f"{g.describe()}: members known only from the calls recorded on it ({g.source}); "
                         f"a member that never called on it cannot be seen")
    wrapped = [r for r, rec in ranks.items() if rec.wrapped]
    if wrapped:
        notes.append(f"the buffers of rank{'s' if len(wrapped) > 1 else ''} {_ranks_text(wrapped)} had dropped "
                     f"older calls; counts per group still hold (Flight Recorder numbers every call of a group)")
    incident = Incident(dumpset.directory if hasattr(dumpset, "directory") else "", version, backend,
                        dumps[0].comm_lib_version, size, dict(sorted(ranks.items())), groups, meshes,
                        [d.rank for d in dumps], notes)
    complete_by_creation_order(incident)  # (before the siblings: a filled group may join them)
    incident.siblings = _siblings(incident)
    complete_siblings(incident)
    _lines_from_peers(incident)
    _one_job(incident)
    _settle_gloo_states(incident)
    _older_dumps(incident)
    from .absent import infer, unrecorded_holds  # (they read the incident this module builds)

    incident.absent = infer(incident)
    incident.notes += [absent.text for absent in incident.absent.values()]
    incident.unrecorded = unrecorded_holds(incident)
    for rank, call in incident.unrecorded.items():
        incident.notes.append(f"rank {rank}'s dump records no call after its last one, but its next call in the "
                              f"program is {call.describe(incident.groups)}, which a member went past without "
                              f"making: it is taken to wait there, before Flight Recorder writes the call's entry "
                              f"(in the group's creation, or its communicator's set-up)")
    return incident


def _groups_seen(dumps: list) -> tuple[dict[str, str], dict[str, list[tuple[int, ...]]]]:
    """Every group name with its description (entries and pg_config), and the member lists pg_config gives."""
    descs: dict[str, tuple[str, str]] = {}  # name -> (desc, the file that said so)
    configured: dict[str, list[tuple[int, ...]]] = {}
    for dump in dumps:
        seen = [(e["process_group"][0], e["process_group"][1]) for e in dump.entries]
        for name, conf in dump.pg_config.items():
            if not isinstance(conf, dict):
                raise ReplayError(f"{dump.path}: pg_config entry {name!r} is not a table")
            ranks = _parse_ranks(dump.path, conf.get("ranks", "[]"))
            if not name and not ranks:
                continue  # gloo's placeholder: recorded before the group had a name or members
            seen.append((str(conf.get("name", name)), str(conf.get("desc", ""))))
            if ranks:
                members = configured.setdefault(str(conf.get("name", name)), [])
                clash = next((m for m in members if set(m) & set(ranks) and m != tuple(ranks)), None)
                if clash is not None:  # split_group's subgroups share a name, but never a rank
                    raise ReplayError(f"{dump.path}: group {conf.get('name', name)} has ranks {ranks} here and "
                                      f"{list(clash)} in another dump: dumps from different jobs?")
                if tuple(ranks) not in members:
                    members.append(tuple(ranks))
        for name, desc in seen:
            name, desc = str(name), str(desc)
            if name in descs and descs[name][0] != desc:
                raise ReplayError(f"{dump.path}: group {name} is {desc!r} here and {descs[name][0]!r} in "
                                  f"{descs[name][1]}: dumps from different jobs?")
            descs.setdefault(name, (desc, dump.path))
    return {n: d for n, (d, _) in descs.items()}, configured


def _one_world(dumps: list, descs: dict[str, str], configured: dict[str, list[tuple[int, ...]]]) -> None:
    """Every dump's rank is in the world its default group names (a dump of a larger or smaller run is not)."""
    for name, desc in descs.items():
        if desc != WORLD_DESC:
            continue
        for members in configured.get(name, []):
            outside = next((d for d in dumps if d.rank not in members), None)
            if outside is not None:
                said = next(d for d in dumps if str(name) in d.pg_config or any(
                    str(c.get("name")) == name for c in d.pg_config.values() if isinstance(c, dict)))
                raise ReplayError(f"{said.path}: its default group is ranks {_ranks_text(members)}, but "
                                  f"{outside.path} is rank {outside.rank}: dumps from different jobs?")


def _parse_ranks(path: str, text: Any) -> list[int]:
    try:
        ranks = ast.literal_eval(text) if isinstance(text, str) else list(text)
    except (ValueError, SyntaxError):
        raise ReplayError(f"{path}: a group's ranks {str(text)[:60]!r} are not a list of ranks") from None
    if not isinstance(ranks, (list, tuple)) or not all(type(r) is int and r >= 0 for r in ranks):
        raise ReplayError(f"{path}: a group's ranks {str(text)[:60]!r} are not a list of ranks")
    return sorted(ranks)


def _group_keys(descs: dict[str, str], configured: dict[str, list[tuple[int, ...]]], dumps: list) -> dict:
    """(rank, group name) -> group key. split_group gives every subgroup of a mesh dim one name, told apart by
    its members (torch's analyzer keys groups by name and ranks for this reason)."""
    key_of: dict[tuple[int, str], str] = {}
    for dump in dumps:
        for name in descs:
            members = configured.get(name, [])
            if len(members) > 1:
                mine = [m for m in members if dump.rank in m]
                key_of[(dump.rank, name)] = f"{name}/{_ranks_text(mine[0])}" if mine else name
            else:
                key_of[(dump.rank, name)] = name
    return key_of


# torch, its shims, the standard library, and meshsim's instrumentation of the ranks (a dump of a meshsim hang
# passes through its progress hooks)
LIBRARY = re.compile(r"/torch/|/typing_extensions\.py$|/lib/python3\.\d+/(?!.*-packages/)|/meshsim/run/")


def _site(frames: Any) -> str | None:
    """The innermost frame outside torch, its shims (typing_extensions' deprecation wrapper) and the standard
    library: where the user's code made the call."""
    found = _user_frames(frames)
    return found[0] if found else None


def _via(frames: Any) -> str | None:
    """The user's frame that called the one at the call's site (meshsim.compat.progress.user_sites)."""
    found = _user_frames(frames)
    return found[1] if len(found) > 1 else None


def _user_frames(frames: Any) -> list[str]:
    found = []
    for frame in frames or ():
        filename = str(frame.get("filename", "")).replace(os.sep, "/")
        if not filename or filename.startswith("<") or LIBRARY.search(filename):
            continue
        found.append(f"{os.path.basename(filename)}:{frame.get('line')}")
        if len(found) == 2:
            break
    return found


def _rank_record(dump: Any, key_of: dict, backends: Counter) -> RankRecord:
    record = RankRecord(dump.rank, dump.path, status=dict(dump.pg_status))
    entries = sorted(dump.entries, key=lambda e: e["record_id"])
    record.wrapped = bool(entries) and entries[0]["record_id"] > 0
    merged: dict[tuple[str, int, bool], list[dict]] = {}
    order: list[tuple[str, int, bool]] = []
    for e in entries:
        name = str(e["process_group"][0])
        key = key_of.get((dump.rank, name), name)
        backend, _, op = str(e["profiling_name"]).partition(":")
        backends[backend] += 1
        p2p = bool(e.get("is_p2p", False)) or op.split(" ")[0] in P2P_OPS
        seq = int(e["p2p_seq_id"] if p2p else e["collective_seq_id"])
        slot = (key, seq, p2p)
        if slot not in merged:
            merged[slot] = []
            order.append(slot)
        merged[slot].append(e)
        record.pg_ids.setdefault(int(e["pg_id"]), key)
        record.pg_id_of.setdefault(key, int(e["pg_id"]))
    gloo = backends.most_common(1)[0][0] == "gloo" if backends else False
    for slot in order:
        record.calls.append(_call(dump.rank, slot, merged[slot], gloo))
    return record


def _call(rank: int, slot: tuple, entries: list[dict], gloo: bool) -> Call:
    """One call from its entries: NCCL writes a coalesced call as its ops plus a closing marker, all under
    one collective_seq_id (the marker is "coalesced", or "ALLGATHER_coalesced" / "REDUCE_SCATTER_coalesced"
    after the ops of all_gather_into_tensor_coalesced / reduce_scatter_tensor_coalesced's slow path)."""
    key, seq, p2p = slot
    names = [str(e["profiling_name"]).partition(":")[2] for e in entries]
    marker = len(entries) > 1 and _is_marker(names[-1], entries[-1])
    parts = entries[:-1] if marker else entries
    ops = tuple(names[:-1] if marker else names)
    first = entries[0]
    last = entries[-1]
    op, _, peer = ops[0].partition(" ")
    in_sizes = tuple(tuple(s) for e in parts for s in e["input_sizes"])
    out_sizes = tuple(tuple(s) for e in parts for s in e["output_sizes"])
    in_dtypes = tuple(d for e in parts for d in _dtypes(e.get("input_dtypes")))
    out_dtypes = tuple(d for e in parts for d in _dtypes(e.get("output_dtypes")))
    fr_state = str(last["state"])  # a coalesced call's state is its marker's: the work that runs them all
    retired = all(bool(e["retired"]) for e in entries)
    if gloo:
        state = RETIRED if retired else IN_FLIGHT  # gloo always writes "scheduled"
    elif fr_state == "completed":
        state = COMPLETED
    else:
        state = TIMED_OUT if retired else IN_FLIGHT
    frames = next((e.get("frames") for e in entries if e.get("frames")), None) or []
    return Call(rank, key, seq, op, in_sizes, out_sizes, in_dtypes, out_dtypes, state, fr_state, _site(frames),
                int(first["record_id"]), int(first.get("time_created_ns") or 0),
                ops if len(ops) > 1 else (), p2p, peer,
                tuple((str(f.get("name")), str(f.get("filename")), f.get("line")) for f in frames),
                _int(first.get("timeout_ms")), op_id=_int(first.get("op_id")), via=_via(frames))


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _is_marker(name: str, entry: dict) -> bool:
    """The entry that closes a coalesced call: named for the coalescing, and with no tensors of its own."""
    named = name == "coalesced" or name.endswith("_coalesced")
    return named and not any(_numel(s) for s in list(entry["input_sizes"]) + list(entry["output_sizes"]) if s)


def _dtypes(value: Any) -> tuple[str, ...]:
    """Flight Recorder writes a list of dtype names; older writers and torch's own tests a single string."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    return tuple(str(d) for d in value)


def _pair_p2p(groups: dict[str, Group], ranks: dict[int, RankRecord]) -> None:
    """Point-to-point calls as calls on a group of their two ranks, one a direction: NCCL matches a rank's k-th
    send to a peer with that peer's k-th receive from it, so each route counts its own calls, and a rank held in
    a send waits for its peer as a rank held in a collective waits for the group's members. The ops of a batch
    (batch_isend_irecv: one p2p_seq_id, closed by a "coalesced" entry) are one call a route."""
    pairs: dict[tuple[str, int, int], str] = {}
    for record in ranks.values():
        counts: Counter = Counter()
        calls: list[Call] = []
        for call in record.calls:
            if not call.p2p:
                calls.append(call)
                continue
            members = groups[call.group].ranks
            ops = call.ops or (f"{call.op} {call.peer}",)
            for index, text in enumerate(ops):
                peer = _p2p_peer(text, members)
                if peer is None:
                    continue  # a marker, or a peer outside what the group's members say
                a, b = (record.rank, peer) if text.startswith("send") else (peer, record.rank)
                key = pairs.setdefault((call.group, a, b), f"{groups[call.group].name}:{a}->{b}")
                counts[key] += 1
                sizes = call.in_sizes[index:index + 1] if len(call.in_sizes) == len(ops) else call.in_sizes
                calls.append(_replace(call, group=key, seq=counts[key], op=text.split(" ")[0], ops=(), peer=text,
                                      in_sizes=sizes, out_sizes=sizes))
        record.set_calls(calls)
    for (group, a, b), key in pairs.items():
        groups[key] = Group(key, groups[group].name, groups[group].desc, tuple(sorted((a, b))), P2P, route=(a, b))
    _settle_batches(groups, ranks)


def _settle_batches(groups: dict[str, Group], ranks: dict[int, RankRecord]) -> None:
    """A batch's state is the state of all its ops together: an op of an unfinished batch whose peer made the
    matching call went through, and only the batch's other ops hold the rank (where it waits for their peers)."""
    for record in ranks.values():
        batches = Counter(c.record_id for c in record.calls if c.p2p)
        for index, call in enumerate(list(record.calls)):
            if not call.p2p or call.finished or batches[call.record_id] < 2:
                continue
            peer = next(r for r in groups[call.group].ranks if r != record.rank)
            if peer in ranks and ranks[peer].dumped and ranks[peer].at(call.group, call.seq) is not None:
                record.replace(index, _replace(call, state=COMPLETED))


def _p2p_peer(text: str, members: tuple[int, ...]) -> int | None:
    """The global rank at the other end of "send 0->1" / "recv 1<-0" (ranks within the group, as NCCL writes)."""
    op, _, ends = text.partition(" ")
    try:
        if op == "send":
            local = int(ends.split("->")[1])
        elif op == "recv":
            local = int(ends.split("<-")[1])
        else:
            return None
    except (IndexError, ValueError):
        return None
    return members[local] if 0 <= local < len(members) else None


def _initial_groups(descs: dict[str, str], configured: dict, key_of: dict, ranks: dict[int, RankRecord],
                    world: int) -> dict[str, Group]:
    groups: dict[str, Group] = {}
    for name, desc in descs.items():
        members_lists = configured.get(name, [])
        if len(members_lists) > 1:
            for members in members_lists:
                key = f"{name}/{_ranks_text(members)}"
                groups[key] = Group(key, name, desc, tuple(members), "pg_config")
        elif members_lists:
            groups[name] = Group(name, name, desc, tuple(members_lists[0]), "pg_config")
        elif desc == WORLD_DESC:
            groups[name] = Group(name, name, desc, tuple(range(world)), "world")
        else:
            seen = sorted({r for r, rec in ranks.items() if any(c.group == name for c in rec.calls)})
            groups[name] = Group(name, name, desc, tuple(seen), "calls")
    return dict(sorted(groups.items(), key=lambda kv: name_order(kv[1].name)))


def _members_from_pg_ids(groups: dict[str, Group], ranks: dict[int, RankRecord], notes: list[str]) -> None:
    """A rank's pg_id counts the groups it is a member of, in the order they were made (the default group is
    0). Between two of its groups with pg_ids p < q it was a member of exactly q - p - 1 others; where the
    only groups with names in between whose members are not all known are that many, it was in each of them.
    A name in between that no dump mentions is a group nobody called on: the rank may have been in it, so it
    counts among the candidates (a mesh dim no rank used took the pg_id as often as a pair group did)."""
    open_groups = [g for g in groups.values() if not g.complete and g.name.isdigit()]
    if not open_groups:
        return
    named = {int(g.name) for g in groups.values() if g.name.isdigit()}
    for rank, record in ranks.items():
        known = sorted((pg_id, groups[key]) for pg_id, key in record.pg_ids.items() if key in groups
                       and groups[key].name.isdigit())
        for (p, lo), (q, hi) in itertools.pairwise(known):
            between = [g for g in groups.values() if g.name.isdigit() and int(lo.name) < int(g.name) < int(hi.name)]
            already = [g for g in between if rank in g.ranks]
            unknown = [g for g in between if not g.complete and rank not in g.ranks]
            unseen = [n for n in range(int(lo.name) + 1, int(hi.name)) if n not in named]
            if q - p - 1 - len(already) == len(unknown) + len(unseen) and unknown:
                for g in unknown:
                    g.ranks = tuple(sorted(set(g.ranks) | {rank}))
                    g.source = "calls+pg_id"
                    notes.append(f"rank {rank} is a member of group {g.name} though it recorded no call there: "
                                 f"its pg_ids jump from {p} to {q} around it")


def _pg_ids_from_members(groups: dict[str, Group], ranks: dict[int, RankRecord]) -> None:
    """Where every group a rank belongs to is known, its pg_ids are their places in creation order: this
    lets pg_status count a group whose calls fell out of the rank's buffer. Kept only where it agrees with
    every pg_id the rank's entries show."""
    if not all(g.name.isdigit() for g in groups.values()):
        return
    names = sorted(int(g.name) for g in groups.values())
    gaps = names and len(names) != names[-1] - names[0] + 1  # a group nobody called on: membership unknown
    if gaps or not all(g.complete for g in groups.values()):
        return
    for record in ranks.values():
        mine = [g.key for g in sorted(groups.values(), key=lambda g: int(g.name)) if record.rank in g.ranks]
        if all(mine.index(key) == pg_id if key in mine else False for key, pg_id in record.pg_id_of.items()):
            record.pg_id_of = {key: i for i, key in enumerate(mine)}
            record._issued = {}


def _siblings(incident: Incident) -> dict[str, str]:
    """Groups outside any mesh (the default group aside) that one line of code calls on, with no rank in common."""
    from ..judge.blame import sibling_parts

    at: dict[Any, set[str]] = {}
    for record in incident.ranks.values():
        for c in record.calls:
            g = incident.groups[c.group]
            if g.mesh is None and g.desc != WORLD_DESC and c.site is not None:
                at.setdefault((c.site, c.op), set()).add(c.group)
    members = {key: frozenset(g.ranks) for key, g in incident.groups.items()}
    return {group: part[1] for group, part in sibling_parts(at, members).items()}


def _lines_from_peers(incident: Incident) -> None:
    """A dump written without stack traces says no line: its calls take the line the other ranks made the same
    call from (same part of the program, same count, same op), so that the replay keeps them one step."""
    lines: dict[tuple, Counter] = {}
    for record in incident.ranks.values():
        for c in record.calls:
            if c.site is not None:
                lines.setdefault((incident.role(c.group), c.seq, c.op), Counter())[c.site] += 1
    filled = set()
    for record in incident.ranks.values():
        for index, c in enumerate(record.calls):
            votes = lines.get((incident.role(c.group), c.seq, c.op)) if c.site is None else None
            if votes:
                record.replace(index, _replace(c, site=votes.most_common(1)[0][0]))
                filled.add(record.rank)
    if filled:
        incident.notes.append(f"the dump{'s' if len(filled) > 1 else ''} of rank{'s' if len(filled) > 1 else ''} "
                              f"{_ranks_text(filled)} hold no stack frames: {'their' if len(filled) > 1 else 'its'} "
                              f"calls' lines are those the other ranks made the same calls from")


def _one_job(incident: Incident) -> None:
    """Members of one collective issue it within its timeout of each other, or it could not have finished: a
    finished call whose members made it further apart than that comes from two runs of a job, not one."""
    for key, g in incident.groups.items():
        calls: dict[int, list[Call]] = {}
        for r in g.ranks:
            for c in incident.ranks[r].on(key) if incident.ranks[r].dumped else ():
                if c.finished and c.time_ns and c.timeout_ms:
                    calls.setdefault(c.seq, []).append(c)
        for made in calls.values():
            early, late = min(made, key=lambda c: c.time_ns), max(made, key=lambda c: c.time_ns)
            apart = (late.time_ns - early.time_ns) / 1e6
            if apart > max(c.timeout_ms for c in made):
                raise ReplayError(f"{incident.ranks[late.rank].file}: {late.describe(incident.groups)} finished, "
                                  f"yet it was made {apart / 1000:.0f} s after rank {early.rank} made it "
                                  f"({incident.ranks[early.rank].file}), longer than its {early.timeout_ms / 1000:.0f}"
                                  f" s timeout: dumps from different runs of a job")


def _older_dumps(incident: Incident) -> None:
    """A collective finishes only once every member made it. A member whose dump shows fewer calls on the group
    than a peer finished (and went past) wrote it before making that call, while the job still moved, or it
    comes from another run of the job: said, since its place in the dumps is then not where it ended up."""
    for key, g in incident.groups.items():
        if g.source == P2P:
            continue  # a small send can finish before its receive is posted (NCCL's eager protocol)
        finished = {}
        for r in g.ranks:
            rec = incident.ranks[r]
            last = rec.last if rec.dumped else None
            for c in rec.on(key) if rec.dumped else ():
                if c.finished and c is not last:
                    finished[c.seq] = c
        if not finished:
            continue
        top = max(finished)
        for r in g.ranks:
            count = incident.ranks[r].issued(key)
            if count is not None and count < top and incident.ranks[r].wrapped is False:
                c = finished[top]
                incident.notes.append(
                    f"rank {r}'s dump shows {count} call{'s' if count != 1 else ''} on {g.describe()}, but rank "
                    f"{c.rank} finished #{top} there and went on, which needs rank {r} to have made it: rank {r}'s "
                    f"dump was written earlier than its peers' (the job still moved), or comes from another run")


def _settle_gloo_states(incident: Incident) -> None:
    """What the states in the dumps do not say directly.

    A call the rank has returned from can still show in flight: gloo retires an entry after the call returns, so
    a rank that raised right after a collective dumps it unretired. A collective completes on every member or on
    none, so where a member finished the same call and went on to others, it completed here too.

    gloo retires a call whether it completed or raised. An exception in a collective ends the rank's work (the
    calls after it are not made), so a retired call that is the rank's last, and that a member never issued or
    still waits in, raised."""
    went_on: dict[tuple, bool] = {}  # (group, seq, signature) -> a member finished it and went on
    for record in incident.ranks.values():
        last = record.last
        if last is not None and last.state == IN_FLIGHT and _finished_elsewhere(incident, last, went_on):
            record.replace(record.calls.index(last), _replace(last, state=RETIRED if last.fr_state == "scheduled"
                                                                and incident.backend == "gloo" else COMPLETED))
            incident.notes.append(f"rank {record.rank}'s dump shows {last.describe(incident.groups)} in flight, "
                                  f"but a member finished it and went on: it completed (Flight Recorder marks a "
                                  f"call after its caller has returned; the rank dumped before that)")
    for record in incident.ranks.values():
        last = record.last
        if last is None or last.state != RETIRED or last.op in ROOTED:  # a rooted call returns on some members alone
            continue
        for m in incident.groups[last.group].ranks:
            other = incident.ranks.get(m)
            if other is None or not other.dumped or m == record.rank:
                continue
            count = other.issued(last.group)
            theirs = other.at(last.group, last.seq)
            if (count is not None and count < last.seq) or (theirs is not None and theirs.state == IN_FLIGHT):
                record.replace(record.calls.index(last), _replace(last, state=FAILED))
                break
    # A member without a dump never finished a call that a dumped member of its group still waits in, nor
    # any call the program makes after that one: such a retired call, last on its rank, raised.
    order = ProgramOrder(incident)
    for m in incident.missing:
        never = {order.key(rec.held) for rec in incident.ranks.values()
                 if rec.dumped and rec.held is not None and rec.held.state == IN_FLIGHT
                 and m in incident.groups[rec.held.group].ranks}
        if not never:
            continue
        for record in incident.ranks.values():
            call = record.last
            if call is None or call.state != RETIRED or m not in incident.groups[call.group].ranks:
                continue
            key = order.key(call)
            if key in never or any(order.precedes(k, key) for k in never):
                record.replace(record.calls.index(call), _replace(call, state=FAILED))


def _finished_elsewhere(incident: Incident, call: Call, seen: dict[tuple, bool]) -> bool:
    """Whether a member of call's group finished that very call (same op, sizes, dtypes) and made more calls.
    A rooted collective needs every other member so: gloo's reduce lets a member that has sent its part return
    while the root still waits for another's, and a broadcast's root returns once it has sent, so one member's
    return says nothing of the others' (a reduce that a member skipped shows retired on some members and in
    flight on the rest); once all the others have gone on, the call had everything it needed."""
    key = (call.group, call.seq, call.signature())
    if key not in seen:
        went_on = [_went_on_from(incident.ranks.get(m), call, key[2]) for m in incident.groups[call.group].ranks
                   if m != call.rank]
        seen[key] = bool(went_on) and all(went_on) if call.op in ROOTED else any(went_on)
    return seen[key]


def _went_on_from(other: RankRecord | None, call: Call, signature: tuple) -> bool:
    if other is None or not other.dumped:
        return False
    theirs = other.at(call.group, call.seq)
    return theirs is not None and theirs.finished and theirs.signature() == signature \
        and other.calls[-1].record_id > theirs.record_id  # (calls are in record_id order)
