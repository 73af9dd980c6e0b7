"""Who is to blame when a run does not finish: one rule for plans, user functions, scripts, torchrun and replays.

Culprits follow from the record (meshsim.core.record), not from who happens to be waiting:
- a rank that died, or raised outside any collective, is a culprit (but where it died in a collective whose
  members passed other tensor sizes, gloo killed whichever noticed: the odd sizes are to blame);
- a rank whose collective raised because a peer left is a victim of that peer;
- a rank stalled outside any collective that others wait for is a straggler, and a culprit;
- among the members of a group that others wait on, the rank whose sequence of calls there parts from the
  others' is the culprit: it issued fewer (it skipped, or left), more (an extra call), or another call at the
  first position where the members disagree. A rank that waits, or that completed a mismatched collective
  because its partner skipped one, is a victim, and the diagnosis says what it did. A rank waits in the call it
  is inside, else in its oldest call in flight (a Work not yet completed: DDP's buckets, async_op, isend, a
  functional collective); a point-to-point call is made on its channel (meshsim.core.wire.SENDS);
- ranks held in a call at a line that more members finished the script without ever reaching added it;
- a rank that finished without a call its part's other finished ranks made, while a partner has not got there
  yet, is a second culprit (the hang behind the first);
- a group created under different names on different ranks: the ranks with the earlier name skipped a new_group;
- over all of that, the whole program through the cluster's symmetries (meshsim.judge.blame.images): a rank whose
  sequence of calls departs from its images' (the ranks a mesh shift or a rank shift maps it to) is the culprit.
Sequences are compared by each call's site (a plan's step, a line of the user's code) and kind, so the answer
does not depend on timing, and the same hang gives the same culprits on every run. Where a group's members
split into camps of equal size, the sites tell who skipped (its next call is the others' current one), then the
plan's own divergence (when there is a plan), then the camp that stopped calling on the group.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from ...core.outcome import KINDS
from ...core.ranks import group_text, ranks_text
from ...core.record import RankState, RunRecord
from ...core.wire import DIED, RAISED, STUCK, CallBegun
from .calls import Blame, Cause, blocked_call, missing_from, same_call
from .collectives import collectives_blame
from .creation import creation_blame
from .parts import ProgramOrder, sibling_parts

__all__ = ["KINDS", "Blame", "Cause", "ProgramOrder", "blame", "blocked_call", "missing_from", "same_call",
           "sibling_parts"]


def _plainly(kind: str, ranks: list[int], states: list[RankState], note: str = "",
             victims: dict[int, str] | None = None) -> Blame:
    """A blame whose causes are where each culprit is."""
    return Blame(kind, ranks, note, victims or {}, [Cause(r, kind, f"rank {r} {states[r].where}") for r in ranks])


def blame(record: RunRecord, divergent: Iterable[int] = (), size_evidence: Iterable[int] = (),
          collided: Iterable[int] = ()) -> Blame:
    """The one rule (see the module's docstring). `divergent`: ranks a plan makes diverge (a tie-breaker only);
    `size_evidence`: ranks the model saw pass other tensor sizes to one collective; `collided`: ranks the model saw
    make different groups under one name (gloo crosses them: which ranks end up waiting, or abort, is a race, so
    the culprits are these, the same on every run)."""
    states = record.states
    crossed = sorted(set(collided))
    if crossed:
        held_now = {s.rank: c for s in states if (c := blocked_call(s)) is not None}
        return _plainly(KINDS["collision"], crossed, states, victims=_waiting_for(held_now, crossed))
    died = [s.rank for s in states if s.end == DIED]
    if died:
        return _sizes_parted(states, died) or _plainly(KINDS["dead"], died, states)
    left_outside = [s.rank for s in states if s.end == RAISED and s.failed_in is None]
    if left_outside:
        return _plainly(KINDS["raised"], left_outside, states)
    held = {s.rank: call for s in states if (call := blocked_call(s)) is not None}
    if not held:  # nobody waits in a call: the ranks still running past the deadline are the stragglers
        stalled = [s.rank for s in states if s.end == STUCK]
        return _rendezvous(record, stalled) or _plainly(KINDS["straggler"] if stalled else KINDS["unknown"],
                                                        stalled, states)
    evidence = sorted(set(size_evidence))
    if evidence:
        return _plainly(KINDS["size"], evidence, states, victims=_waiting_for(held, evidence))
    if any(call.kind == "new_group" for call in held.values()):
        found = creation_blame(states, held)
        found.causes = [Cause(r, found.kind, f"rank {r} {states[r].where}") for r in found.culprits]
        return found
    return collectives_blame(states, held, set(divergent), record.unseen, _in_torch_distributed(record, held))


# init_process_group's rendezvous: connecting to the store (env://, tcp://), or waiting for every rank to join it
_RENDEZVOUS = re.compile(r"/torch/distributed/(?:rendezvous\.py|elastic/rendezvous/)|in _create_c10d_store|"
                         r"in _store_based_barrier|in _env_rendezvous_handler|in _tcp_rendezvous_handler")


def _rendezvous(record: RunRecord, stalled: list[int]) -> Blame | None:
    """Ranks that made no collective call, held in init_process_group's rendezvous (their Python stacks say so):
    the job never formed. Where every stalled rank is there, the store they connect to is not served (a script
    that sets MASTER_ADDR/MASTER_PORT or an init_method of its own, which torchrun's workers connect to as clients)
    or the world it waits for is not this launch's: no rank is to blame more than another. Ranks stalled elsewhere
    never reached the rendezvous the others wait in: they are the stragglers."""
    states = record.states
    if not stalled or any(s.completed or s.call_log for s in states):
        return None
    inside = [r for r in stalled if _RENDEZVOUS.search(record.stacks.get(r, "").split("Current thread", 1)[-1])]
    if not inside:
        return None
    where = "waits in init_process_group's rendezvous (connecting to its store, or for the other ranks to join)"
    victims = {r: where for r in inside}
    outside = [r for r in stalled if r not in inside]
    if outside:
        return Blame(KINDS["straggler"], outside, "", victims,
                     [Cause(r, KINDS["straggler"], f"rank {r} never reached init_process_group, where ranks "
                            f"{ranks_text(inside)} wait for it: {states[r].where}") for r in outside])
    note = (f"Every rank {where}: no rank is to blame more than another. The store is not served (the script sets "
            "MASTER_ADDR/MASTER_PORT or an init_method of its own, which torchrun's workers all connect to as "
            "clients), or the world it waits for is not this launch's (WORLD_SIZE, --nnodes x --nproc-per-node)")
    return Blame(KINDS["rendezvous"], [], note, victims, [])


# where torch's distributed machinery calls collectives from C++, out of the Python calls meshsim follows (DDP's
# reducer, FSDP's and DTensor's internals, c10d itself)
_DISTRIBUTED = re.compile(r'File "(?P<file>[^"]*/torch/(?:distributed|nn/parallel)/[^"]+)", line (?P<line>\d+) in '
                          r'(?P<func>\S+)')
_FIRST_FRAME = re.compile(r'File "[^"]+", line \d+ in \S+')


def _in_torch_distributed(record: RunRecord, held: dict[int, CallBegun]) -> dict[int, str]:
    """Ranks stuck in no call the record shows, whose innermost frame is in torch's distributed code: each may wait
    in a call torch makes from C++ (DDP rebuilding its buckets broadcasts from C++), not stall. Where each is."""
    found = {}
    for s in record.states:
        stack = record.stacks.get(s.rank, "")
        if s.end != STUCK or s.rank in held or "Current thread" not in stack:
            continue
        first = _FIRST_FRAME.search(stack.split("Current thread", 1)[1])
        inner = _DISTRIBUTED.match(first.group(0)) if first is not None else None
        if inner is not None:
            found[s.rank] = f"{inner['func']} at {os.path.basename(inner['file'])}:{inner['line']}"
    return found


def _sizes_parted(states: list[RankState], died: list[int]) -> Blame | None:
    """A rank that died inside a collective whose members passed other tensor sizes: gloo aborts the process
    that notices (any of them), so the members that passed the odd sizes are to blame, whichever died."""
    for rank in died:
        call = states[rank].call
        if call is None or call.kind == "new_group":
            continue
        camps: dict[str, list[int]] = {}
        for m in call.ranks:
            size = states[m].sizes.get((call.group, call.seq)) if m < len(states) else None
            if size is not None:
                camps.setdefault(size, []).append(m)
        largest = max((len(r) for r in camps.values()), default=0)
        top = [size for size, ranks in camps.items() if len(ranks) == largest]
        if len(camps) < 2 or len(top) > 1:
            continue
        odd = sorted(m for size, ranks in camps.items() if size != top[0] for m in ranks)
        note = (f"Rank{'s' if len(odd) > 1 else ''} {ranks_text(odd)} passed "
                f"{' and '.join(size for size in camps if size != top[0])} to {call.kind} #{call.seq} on group "
                f"{group_text(call.ranks)} where the others passed {top[0]}; rank {rank} {states[rank].where}.")
        return Blame(KINDS["size"], odd, note, {}, [Cause(r, KINDS["size"], note, call.group, call.seq) for r in odd])
    return None


def _waiting_for(held: dict[int, CallBegun], culprits: list[int]) -> dict[int, str]:
    out = {}
    for rank, call in held.items():
        if rank not in culprits:
            out[rank] = f"waits in {call.kind} on group {group_text(call.ranks)}"
    return out
