"""gloo's connected transports, kept from one plan to the next on a cluster's ranks.

Every group a plan makes is a new gloo backend: a device, a socket to every other member (addresses traded
through the store), two worker threads; destroying it joins them. On 2 cores that was most of what a plan of a
mesh and a `check` cost its ranks (a 2 x 4 mesh: 0.29 s to make and 0.11 s to destroy, against 0.04 and 0.005
with the transports kept, measured under load). Everything torch shows stays torch's own: new_group,
DeviceMesh, the ProcessGroup, its name, description and rank bookkeeping are made afresh for every plan; only
the backend under a group of the same members (and the same timeout) is the one a previous plan's group
connected. Its members still meet as a new gloo group's members do (each waits until all have come, through
the store, where gloo would trade addresses), so a rank that does not make the group leaves the others waiting
in new_group as before. A new backend's members meet so too, before gloo's own exchange: two sets of ranks
making groups under one name cross there, and gloo connects them now and then by luck; the meet makes that a
hang on every run.

A kept backend is in step on every member only if every member issued it the same collectives. The ranks
report each transport's sequence number (torch counts every collective a backend runs, whatever called it) at
the end of each plan, and the controller keeps the transports only where the members' counts agree and every
rank finished with nothing in flight (`keep`); otherwise every rank forgets them all, which destroys them as
destroying their groups used to. A rank keeps at most KEEP_AT_MOST transports (each one's socket loop wakes a
hundred times a second), with at most PEERS_AT_MOST sockets to other members among them; the controller forgets
the least recently used beyond, on every member alike.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterable
from typing import Any

from ..compat.patching import arguments
from ..compat.progress import current
from ..core.wire import FINISHED

# the group's global ranks, its timeout in seconds, and how many groups of those ranks the plan made before it:
# two groups of the same members are two gloo contexts in torch (a collective on one never meets one on the other)
Key = tuple[tuple[int, ...], float, int]
# transports per rank. Each kept one costs its socket loop's wake-ups (8 idle ranks: 9% of a core at 48, 6% at 12);
# each one forgotten and made again costs a teardown that joins its threads and a connect (a 2 x 4 sweep, seed 3:
# 149 forgotten in 120 plans at 12, 0 at 48; its marginal rate 29-31/s against 26-27/s, alternated)
KEEP_AT_MOST = 48
# sockets to other members over a rank's kept transports: a wide world's groups stay well inside a 1024-file limit
PEERS_AT_MOST = 256
_MET = "meshsim/kept"  # the store key (under the new group's prefix) its members count themselves in at


class Transports:
    """One rank's kept gloo backends (ProcessGroupGloo), by the members and timeout of the group they serve."""

    def __init__(self, rank: int):
        self.rank = rank
        self.kept: dict[Key, Any] = {}
        self.touched: set[Key] = set()  # made or reused by the running plan
        self.making: Key | None = None  # the group being made now
        self.on = False  # while a plan runs (a user function's groups are its own)
        self.made: dict[tuple[tuple[int, ...], float], int] = {}  # groups of these members the plan has made

    def begin(self) -> None:
        """A plan starts: its groups are counted afresh (the n-th group of some members is its own transport)."""
        self.on = True
        self.made.clear()

    def report(self) -> tuple[tuple[Key, int], ...]:
        """The sequence number of every transport the plan made or reused (torch counts each collective)."""
        return tuple((key, self.kept[key]._get_sequence_number_for_group()) for key in sorted(self.touched)
                     if key in self.kept)

    def forget(self, keys: Iterable[Key] | None) -> None:
        """After a plan's groups are destroyed: drop these transports (None: all), which destroys them."""
        if keys is None:
            self.kept.clear()
        else:
            for key in keys:
                self.kept.pop(tuple(key), None)  # type: ignore[arg-type]
        self.touched.clear()


_active: Transports | None = None


def install(transports: Transports) -> None:
    """Make this process's new gloo groups use `transports` (once; a rank process has one)."""
    global _active
    import torch.distributed.distributed_c10d as c10d

    first = _active is None
    _active = transports
    if not first:
        return
    module: Any = c10d
    base = c10d.ProcessGroupGloo
    kept_class = _kept_class(base)
    original = c10d._new_process_group_helper
    defaults = {name: p.default for name, p in inspect.signature(original).parameters.items()
                if p.default is not inspect.Parameter.empty}

    def helper(*args: Any, **kwargs: Any) -> Any:
        if _active is None or not _active.on:
            return original(*args, **kwargs)
        members, connects = _key({**defaults, **arguments(original, args, kwargs)})
        if members is None:
            if connects:  # a backend of its own: its connect holds the GIL, so say where the rank is first
                current().flush()
            return original(*args, **kwargs)
        key = (*members, _active.made.get(members, 0))
        _active.made[members] = key[2] + 1
        _active.making = key
        module.ProcessGroupGloo = kept_class  # what the helper builds gloo with, for this group alone
        try:
            return original(*args, **kwargs)
        finally:
            module.ProcessGroupGloo = base
            _active.making = None

    c10d._new_process_group_helper = helper


def _key(call: dict[str, Any]) -> tuple[tuple[tuple[int, ...], float] | None, bool]:
    """The transport a group may share (a gloo subgroup this rank is a member of, with no options of its own), and
    whether this rank connects a backend for the group (a member; a subgroup's ranks, or the world)."""
    import torch.distributed as dist

    ranks = call.get("global_ranks_in_group")
    if not ranks or dist.get_rank() not in ranks:
        return None, not ranks
    timeout = call.get("timeout")
    if timeout is None or call.get("backend_options") is not None or str(call.get("backend")) != "gloo":
        return None, True
    return (tuple(ranks), float(timeout.total_seconds())), True


def _kept_class(base: Any) -> type:
    """ProcessGroupGloo that hands out the kept backend of the group being made, and keeps a new one."""

    class KeptGloo(base):
        def __new__(cls, store: Any, rank: int, size: int, *args: Any, **kwargs: Any) -> Any:
            found = _active.kept.get(_active.making) if _active is not None and _active.making else None
            return found if found is not None else super().__new__(cls)

        def __init__(self, store: Any, rank: int, size: int, *args: Any, **kwargs: Any) -> None:
            assert _active is not None and _active.making is not None
            key = _active.making
            _active.touched.add(key)
            # a kept backend or a new one, its members meet first: gloo's own exchange under a crossed name
            # connects by luck now and then (whose address a key holds last), the meet makes that hang every time
            _meet(store, size, ",".join(map(str, key[0])))
            if getattr(self, "_meshsim_kept", False):
                return
            current().flush()  # gloo's connect holds the GIL: say where the rank is first
            super().__init__(store, rank, size, *args, **kwargs)
            self._meshsim_kept = True
            _active.kept[key] = self

    return KeptGloo


def _meet(store: Any, size: int, members: str) -> None:
    """Wait until every member has come to make the group, as gloo's exchange of addresses waits (a store
    barrier under the group's own prefix: its name is new to this plan). Where another set of ranks makes a group
    of the same name (torch names some groups alike: finding group-name-collision), gloo's exchange under that
    name crosses the two sets and nobody connects: the members wait, as on gloo, until the deadline."""
    arrived = store.add(_MET, 1)
    store.set(f"{_MET}/{arrived}", members)
    if arrived > size:
        store.wait([_MET + "/never"])
    # multi_get waits for every key, then reads them all: one round trip. Every member reads the same `size` keys,
    # so all of them pass or none does; nothing more to wait for.
    if any(value.decode() != members for value in store.multi_get([f"{_MET}/{i}" for i in range(1, size + 1)])):
        store.wait([_MET + "/never"])


# ------------------------------------------------------------------------------------------------ the controller


class Keeper:
    """The controller's side: after each plan, whether the ranks keep their transports, and which they forget."""

    def __init__(self, generation: int, at_most: int = KEEP_AT_MOST):
        self.generation = generation  # the generation of ranks that keeps them
        self.at_most = at_most
        self.used: dict[Key, int] = {}  # transport -> the last plan that touched it
        self.plans = 0

    def after(self, states: list[Any]) -> tuple[Key, ...] | None:
        """What every rank forgets after this plan (None: all of them)."""
        self.plans += 1
        reports = {state.rank: dict(state.transports) for state in states}
        clean = all(state.end == FINISHED and not state.in_flight for state in states)
        if not clean or not _in_step(reports):
            self.used.clear()
            return None
        for found in reports.values():
            for key in found:
                self.used[key] = self.plans
        forget: list[Key] = []
        for rank in reports:
            mine = sorted(((used, key) for key, used in self.used.items() if rank in key[0]), reverse=True)
            peers = itertools.accumulate(len(key[0]) - 1 for _, key in mine)  # a socket to each other member
            forget += [key for n, ((_, key), sockets) in enumerate(zip(mine, peers))
                       if n >= self.at_most or sockets > PEERS_AT_MOST]
        for key in forget:
            self.used.pop(key, None)
        return tuple(sorted(set(forget)))


def _in_step(reports: dict[int, dict[Key, int]]) -> bool:
    """Every transport a plan touched counts as many collectives on each of its members."""
    for found in reports.values():
        for key, seq in found.items():
            if any(reports.get(member, {}).get(key) != seq for member in key[0]):
                return False
    return True
