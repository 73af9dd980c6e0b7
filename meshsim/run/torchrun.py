"""The torchrun executor: plans run by the processes torchrun started, on one node or many.

There is no controller here. Every rank calls `execute` with the same plan (SPMD), publishes its progress and
its observations to the store torchrun's rendezvous made, and keeps a watchdog thread. After a plan every rank
reads every rank's observations back, so every rank returns the same RunRecord. When a plan passes its
deadline, the first watchdog to fire reads every rank's progress and stacks from the store, hands the
timed-out RunRecord to `on_hang` (the caller judges and reports it) and makes every rank exit with code 1,
without waiting for torch's 30-minute timeout.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:PORT -m meshsim nightly
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..core import deadlines, pace
from ..core.record import RankState, RunRecord
from ..core.wire import STUCK, CallBegun, RunPlan
from ..spec.platform import platform_for
from ..spec.tiers import Capabilities, TierError
from .generation import WARM_MODULES
from .process import resolve_backend
from .rank import RankSession

PREFIX = "meshsim/"
REPORT_WAIT_S = 5.0  # how long the other ranks give the reporting rank before they leave


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and "LOCAL_WORLD_SIZE" in os.environ


# --------------------------------------------------------------------------------------------- progress

_STATE_FIELDS = ("step", "op", "out", "call", "calls_on", "groups_created", "created", "meshes", "done",
                 "end", "end_step", "failed_in", "failure", "created_as", "created_at", "group_index", "completed",
                 "done_times")


def state_to_json(state: RankState) -> str:
    data = {k: getattr(state, k) for k in _STATE_FIELDS}
    data["created"] = {k: list(v) for k, v in state.created.items()}
    data["call_log"] = [[g, s, step, kind] for (g, s), (step, kind) in state.call_log.items()]
    data["issued"] = [list(entry) for entry in state.issued]
    data["group_ranks"] = {k: list(v) for k, v in state.group_ranks.items()}
    data["roots"] = [[g, s, root] for (g, s), root in state.roots.items()]
    data["vias"] = [[g, s, via] for (g, s), via in state.vias.items()]
    return json.dumps(data, default=list)


def state_from_json(rank: int, text: str) -> RankState:
    data = json.loads(text)
    state = RankState(rank)
    for key in _STATE_FIELDS:
        setattr(state, key, data[key])
    for key in ("call", "failed_in"):
        if data[key]:
            kind, ranks, group, seq, context, *rest = data[key]  # (site, sizes, root, via: CallBegun's order)
            setattr(state, key, CallBegun(kind, tuple(ranks), group, seq, tuple(context) if context else None,
                                          *rest))
    state.created = {k: tuple(v) for k, v in data["created"].items()}
    state.call_log = {(g, s): (step, kind) for g, s, step, kind in data["call_log"]}
    state.issued = [(g, s) for g, s in data["issued"]]
    state.group_ranks = {k: tuple(v) for k, v in data["group_ranks"].items()}
    state.roots = {(g, s): root for g, s, root in data["roots"]}
    state.vias = {(g, s): via for g, s, via in data.get("vias", [])}
    state.meshes = [tuple(m) for m in data["meshes"]]
    return state


class StoreProgress:
    """Keeps this rank's RankState from its own events and publishes it to the store after each one."""

    def __init__(self, store: Any, rank: int):
        self.store = store
        self.rank = rank
        self.plan = 0
        self.state = RankState(rank)
        self.lock = threading.Lock()

    def begin(self, plan: int) -> None:
        with self.lock:
            self.plan, self.state = plan, RankState(self.rank)
            self._publish()

    def send(self, event: Any) -> None:
        with self.lock:
            self.state.on_event(event)
            self._publish()

    def finish(self, end: str, end_step: int | None) -> None:
        with self.lock:
            self.state.done, self.state.end, self.state.end_step = True, end, end_step
            self._publish()

    def _publish(self) -> None:
        self.store.set(f"progress/{self.plan}/{self.rank}", state_to_json(self.state))


def store_barrier(store: Any, key: str, world: int, timeout_s: float) -> None:
    if store.add(key, 1) == world:
        store.set(key + "/all", "1")
    store.wait([key + "/all"], timedelta(seconds=timeout_s))


def read_states(store: Any, plan: int, world: int) -> list[RankState]:
    states = []
    for rank in range(world):
        key = f"progress/{plan}/{rank}"
        state = state_from_json(rank, store.get(key).decode()) if store.check([key]) else RankState(rank)
        if not state.done:
            state.end = STUCK
        states.append(state)
    return states


def own_stack() -> str:
    with tempfile.TemporaryFile(mode="w+") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
        fh.seek(0)
        return fh.read()


# --------------------------------------------------------------------------------------------- the executor

class Watchdog:
    """Calls `fire(item)` on its own thread when an armed deadline passes (the main thread may be in C++)."""

    def __init__(self, fire: Callable[[Any], None]):
        self.fire = fire
        self.armed: tuple[float, Any] | None = None
        self.cond = threading.Condition()
        threading.Thread(target=self._watch, name="meshsim-watchdog", daemon=True).start()

    def arm(self, deadline_s: float, item: Any) -> None:
        with self.cond:
            self.armed = (time.monotonic() + deadline_s, item)
            self.cond.notify()

    def disarm(self) -> None:
        with self.cond:
            self.armed = None
            self.cond.notify()

    def _watch(self) -> None:
        while True:
            with self.cond:
                while self.armed is None:
                    self.cond.wait()
                until, item = self.armed
                left = until - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
            self.fire(item)


class TorchrunExecutor:
    """The Executor protocol on the ranks torchrun started; every rank calls each method in the same order.

    on_hang(work, record) is called on one rank (the reporter) when a plan runs past its deadline; the process
    exits with code 1 after it returns.
    """

    tier = "torchrun"
    capabilities = Capabilities(1 << 20, functions=False, backends=("gloo", "nccl", "cpu:gloo,cuda:nccl", "auto"),
                                describe="the ranks torchrun started, on one node or many")

    def __init__(self, backend: str, on_hang: Callable[[Any, RunRecord], None]):
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_world = int(os.environ["LOCAL_WORLD_SIZE"])
        # One rank per GPU of this node: the node's ranks need its GPUs, as a simulated host's do.
        self.backend = resolve_backend(backend, self.local_world)
        self.platform = platform_for(self.backend)  # for the model
        self.on_hang = on_hang
        for module in WARM_MODULES:  # before any deadline, as the local cluster's forkserver does
            importlib.import_module(module)
        # (the session reports progress only once a plan runs, by when self.progress exists)
        self.session = RankSession.join(self.backend, self.rank, self.world, lambda e: self.progress.send(e))
        self.store = self.session.store = _prefixed(self.session.store)
        self.progress: StoreProgress = StoreProgress(self.store, self.rank)
        self.plans = 0
        self.watchdog = Watchdog(self._past_deadline)

    @property
    def topology(self) -> Any:
        from ..spec.topology import Topology

        return Topology(self.world // self.local_world, self.local_world)

    def share(self, key: str, make: Callable[[], str]) -> str:
        """A text rank 0 makes (make()) and every rank gets."""
        if self.rank == 0:
            self.store.set(key, make())
        return self.store.get(key).decode()

    def execute(self, work: Any, meanwhile: Callable[[], Any] | None = None,
                if_hangs: Callable[[], float | None] | None = None) -> RunRecord:
        if not isinstance(work, RunPlan):
            raise TierError("under torchrun meshsim runs plans; run your own functions with `meshsim launch`")
        index, self.plans = self.plans, self.plans + 1
        hang_wait = if_hangs() if if_hangs is not None else None  # (the model's answer first: the run is in line)
        if hang_wait is not None:
            work = work._replace(deadline=min(work.deadline, hang_wait))
        wait_s = deadlines.torch_wait(work.deadline)  # store waits outlast the deadline: the watchdog reports
        self.progress.begin(index)
        started = time.monotonic()
        self.watchdog.arm(work.deadline, (index, work))
        done = self.session.run_plan(work.plan, work.deadline)
        self.progress.finish(done.end, done.end_step)
        self.store.set(f"result/{index}/{self.rank}", json.dumps([done.observations, done.end, done.end_step,
                                                                  done.group_count]))
        if meanwhile is not None:
            meanwhile()
        store_barrier(self.store, f"ran/{index}", self.world, wait_s)
        self.watchdog.disarm()
        states = []
        for rank in range(self.world):
            observations, end, end_step, groups = json.loads(self.store.get(f"result/{index}/{rank}").decode())
            states.append(RankState(rank, observations=observations, end=end, end_step=end_step, done=True,
                                    group_count=groups))
        record = RunRecord(self.world, work.deadline, states, time.monotonic() - started, False)
        self.session.teardown(1 + max(s.group_count for s in states))
        store_barrier(self.store, f"clean/{index}", self.world, wait_s)
        return record

    def close(self, code: int) -> int:
        """Leave together with the verdict rank 0 reached; returns it on every rank."""
        code = int(self.share("verdict", lambda: str(code)))
        store_barrier(self.store, "exit", self.world, deadlines.START_S)
        self.session.dist.destroy_process_group()
        return code

    # ------------------------------------------------------------------ past the deadline

    def _past_deadline(self, item: Any) -> None:
        """On the watchdog thread. The main thread may be stuck in C++; this one still runs."""
        index, work = item
        self.store.set(f"stack/{index}/{self.rank}", own_stack())
        if self.rank != 0:
            time.sleep(1.0)  # rank 0 holds the report so far: let it be the one to write it
        if self.store.compare_set(f"reporter/{index}", "", str(self.rank)).decode() == str(self.rank):
            try:
                time.sleep(min(1.0, work.deadline / 4))  # let the other watchdogs publish their stacks
                # every unfinished rank still completes calls: watch a little longer before calling it a hang
                time.sleep(pace.grace(read_states(self.store, index, self.world), time.time()))
                self.on_hang(work, self._hung_record(index, work))
            finally:
                self.store.set("verdict", "1")
        else:
            try:
                self.store.wait(["verdict"], timedelta(seconds=REPORT_WAIT_S + pace.MAX_WINDOW_S))
            except Exception:
                pass
        os._exit(1)

    def _hung_record(self, index: int, work: Any) -> RunRecord:
        states = read_states(self.store, index, self.world)
        record = RunRecord(self.world, work.deadline, states, work.deadline, True, ended_at=time.time())
        record.stacks = {r: self.store.get(f"stack/{index}/{r}").decode() for r in range(self.world)
                         if states[r].end == STUCK and self.store.check([f"stack/{index}/{r}"])}
        return record


def _prefixed(store: Any) -> Any:
    import torch.distributed as dist

    return dist.PrefixStore(PREFIX, store)
