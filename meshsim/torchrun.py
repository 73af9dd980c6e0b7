"""The nightly suite run by ranks that torchrun started (one node or many).

There is no controller here: every rank runs the same plans itself, publishes its progress to the store
torchrun's rendezvous made, and keeps a watchdog thread. When a plan passes its deadline, the first watchdog
to fire reads every rank's progress from the store, prints the diagnosis, writes the report and makes every
rank exit with code 1, without waiting for torch's 30-minute timeout. Rank 0 judges every plan against the
model and writes the report; every rank exits with the verdict's code.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:PORT -m meshsim nightly
"""

from __future__ import annotations

import faulthandler
import json
import os
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

from .cluster.controller import resolve_backend
from .cluster.record import RankState, RunRecord

PREFIX = "meshsim/"
REPORT_WAIT_S = 5.0  # how long the other ranks give the reporting rank before they leave
BACKSTOP_S = 30.0  # store waits outlast the deadline by this much: the watchdog reports first


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and "LOCAL_WORLD_SIZE" in os.environ


# --------------------------------------------------------------------------------------------- progress

_STATE_FIELDS = ("step", "op", "out", "call", "calls_on", "groups_created", "created", "meshes", "done",
                 "end", "end_step")


def state_to_json(state: RankState) -> str:
    data = {k: getattr(state, k) for k in _STATE_FIELDS}
    data["created"] = {k: list(v) for k, v in state.created.items()}
    data["call_log"] = [[g, s, step, kind] for (g, s), (step, kind) in state.call_log.items()]
    return json.dumps(data, default=list)


def state_from_json(rank: int, text: str) -> RankState:
    data = json.loads(text)
    state = RankState(rank)
    for key in _STATE_FIELDS:
        setattr(state, key, data[key])
    state.call = tuple(data["call"]) if data["call"] else None
    state.created = {k: tuple(v) for k, v in data["created"].items()}
    state.call_log = {(g, s): (step, kind) for g, s, step, kind in data["call_log"]}
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

    def send(self, event: tuple) -> None:
        with self.lock:
            self.state.on_event(event)
            self._publish()

    def finish(self, end: str, end_step: int | None) -> None:
        with self.lock:
            self.state.done, self.state.end, self.state.end_step = True, end, end_step
            self._publish()

    def _publish(self) -> None:
        self.store.set(f"progress/{self.plan}/{self.rank}", state_to_json(self.state))


# --------------------------------------------------------------------------------------------- the store

def store_barrier(store: Any, key: str, world: int, timeout_s: float) -> None:
    if store.add(key, 1) == world:
        store.set(key + "/all", "1")
    store.wait([key + "/all"], timedelta(seconds=timeout_s))


def read_states(store: Any, plan: int, world: int) -> list[RankState]:
    states = []
    for rank in range(world):
        key = f"progress/{plan}/{rank}"
        if store.check([key]):
            state = state_from_json(rank, store.get(key).decode())
        else:
            state = RankState(rank)
        if not state.done:
            state.end = "stuck"
        states.append(state)
    return states


# --------------------------------------------------------------------------------------------- watchdog

class Watchdog:
    """Ends the job with a diagnosis when a plan runs past its deadline."""

    def __init__(self, runner: "TorchrunRunner"):
        self.runner = runner
        self.armed: tuple[int, float, Any] | None = None
        self.cond = threading.Condition()
        threading.Thread(target=self._watch, name="meshsim-watchdog", daemon=True).start()

    def arm(self, plan: int, deadline_s: float, item: Any) -> None:
        with self.cond:
            self.armed = (plan, time.monotonic() + deadline_s, item)
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
                plan, until, item = self.armed
                left = until - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
            self.runner.on_deadline(plan, item)


def own_stack() -> str:
    with tempfile.TemporaryFile(mode="w+") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
        fh.seek(0)
        return fh.read()


# --------------------------------------------------------------------------------------------- the run

class TorchrunRunner:
    def __init__(self, args: Any):
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        from .worker.execute import Executor
        from .worker.progress import Progress, install

        self.args = args
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_world = int(os.environ["LOCAL_WORLD_SIZE"])
        # One rank per GPU of this node: the node's ranks need its GPUs, as a simulated host's do.
        self.backend = backend = resolve_backend(args.backend, self.local_world)
        device_type = "cuda" if "nccl" in backend else "cpu"
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        timeout = timedelta(seconds=args.deadline + BACKSTOP_S)
        c10d.default_pg_timeout = timeout
        dist.init_process_group(backend, timeout=timeout)
        self.dist, self.c10d = dist, c10d
        self.store = dist.PrefixStore(PREFIX, c10d._get_default_store())
        self.store.set_timeout(timeout)
        self.baseline = set(c10d._world.pg_map)
        self.progress = StoreProgress(self.store, self.rank)
        events = Progress(self.progress.send)
        install(events)
        self.executor = Executor(self.rank, self.world, device_type, events)
        self.report: Any = None
        self.watchdog = Watchdog(self)

    @property
    def topology(self) -> Any:
        from .topology import Topology

        return Topology(self.world // self.local_world, self.local_world)

    def suite(self) -> list[tuple[str, str, Any, float]]:
        """(suite, name, plan, deadline) for every case; rank 0 draws it and publishes it to every rank."""
        from .plan import Plan

        if self.rank == 0:
            cases = self._draw_suite()
            self.store.set("suite", json.dumps([(s, n, p.to_dict(), d) for s, n, p, d in cases]))
        raw = json.loads(self.store.get("suite").decode())
        return [(s, n, Plan.from_dict(p), d) for s, n, p, d in raw]

    def _draw_suite(self) -> list[tuple[str, str, Any, float]]:
        from .nightly import passing_scenarios

        cases = []
        if self.args.scenarios and os.path.isdir(self.args.scenarios):
            for sc in passing_scenarios(self.args.scenarios, self.world):
                cases.append(("scenario", sc.name, sc.plan, sc.deadline))
        for index, plan in enumerate(draw_plans(self.world, self.args.examples, self.args.seed)):
            cases.append(("fuzz", f"fuzz seed {self.args.seed} #{index}", plan, self.args.deadline))
        return cases

    def run(self) -> int:
        from .nightly import NightlyReport

        cases = self.suite()
        self.report = NightlyReport(str(self.topology), self.backend, self.args.seed, mode="torchrun")
        for index, (suite, name, plan, deadline) in enumerate(cases):
            self.progress.begin(index)
            started = time.monotonic()
            # The deadline covers the plan and the wait for the others to finish it; the barrier's own limit
            # is only a backstop, so that the watchdog is the one to report.
            self.watchdog.arm(index, deadline, (suite, name, plan, deadline))
            observations, end, end_step = self.executor.run(plan)
            self.progress.finish(end, end_step)
            self.store.set(f"result/{index}/{self.rank}", json.dumps([observations, end, end_step]))
            self.store.set(f"groups/{index}/{self.rank}", str(self.c10d._world.group_count))
            store_barrier(self.store, f"ran/{index}", self.world, deadline + BACKSTOP_S)
            self.watchdog.disarm()
            if self.rank == 0:
                self.report.items.append(self._judge(index, suite, name, plan, deadline, started))
            self.executor.release(self.baseline,
                                  1 + max(int(self.store.get(f"groups/{index}/{r}")) for r in range(self.world)))
            store_barrier(self.store, f"clean/{index}", self.world, deadline + BACKSTOP_S)
        return self._finish()

    def _judge(self, index: int, suite: str, name: str, plan: Any, deadline: float, started: float) -> Any:
        from .model import predict
        from .nightly import Item
        from .testing import render_text
        from .verdict import judge

        states = []
        for rank in range(self.world):
            observations, end, end_step = json.loads(self.store.get(f"result/{index}/{rank}").decode())
            states.append(RankState(rank, observations=observations, end=end, end_step=end_step, done=True))
        record = RunRecord(self.world, deadline, states, time.monotonic() - started, False)
        result = judge(plan, predict(plan, self.world, deadline), record)
        detail = result.outcome if result.passed else render_text(result)
        return Item(suite, name, result.passed, record.elapsed, detail,
                    {"outcome": result.outcome, "findings": sorted(result.findings)})

    def _finish(self) -> int:
        code = 0
        if self.rank == 0:
            code = self._publish_report()
            self.store.set("verdict", str(code))
        else:
            code = int(self.store.get("verdict").decode())
        store_barrier(self.store, "exit", self.world, 60)
        self.dist.destroy_process_group()
        return code

    def _publish_report(self) -> int:
        from .nightly import render, write_outputs
        from .report import make_console

        render(self.report, make_console())
        write_outputs(self.report, self.args.json_out, self.args.junit)
        return 0 if self.report.passed else 1

    # ------------------------------------------------------------------ past the deadline

    def on_deadline(self, plan: int, item: Any) -> None:
        """Called on the watchdog thread. The main thread may be stuck in C++; this one still runs."""
        self.store.set(f"stack/{plan}/{self.rank}", own_stack())
        if self.rank != 0:
            time.sleep(1.0)  # rank 0 holds the report so far: let it be the one to write it
        if self.store.compare_set(f"reporter/{plan}", "", str(self.rank)).decode() == str(self.rank):
            try:
                self._report_hang(plan, item)
            finally:
                self.store.set("verdict", "1")
        else:
            try:
                self.store.wait(["verdict"], timedelta(seconds=REPORT_WAIT_S))
            except Exception:
                pass
        os._exit(1)

    def _report_hang(self, plan: int, item: Any) -> None:
        from .diagnose import diagnose
        from .model import predict
        from .nightly import Item, NightlyReport, render, write_outputs
        from .report import make_console, render_diagnosis

        suite, name, plan_obj, deadline = item
        time.sleep(min(1.0, deadline / 4))  # let the other watchdogs publish their stacks
        states = read_states(self.store, plan, self.world)
        record = RunRecord(self.world, deadline, states, deadline, True)
        record.stacks = {r: self.store.get(f"stack/{plan}/{r}").decode() for r in range(self.world)
                         if self.store.check([f"stack/{plan}/{r}"]) and states[r].end == "stuck"}
        diagnosis = diagnose(record, plan_obj, predict(plan_obj, self.world, deadline))
        console = make_console()
        console.print(f"[bold red]{suite} {name}: hang past its {deadline:g} s deadline[/] (reported by rank "
                      f"{self.rank})")
        render_diagnosis(diagnosis, console)
        report = self.report or NightlyReport(str(self.topology), self.backend, self.args.seed, mode="torchrun")
        report.items.append(Item(suite, name, False, deadline, f"hang: {diagnosis.summary}",
                                 {"outcome": "hang", "diagnosis": diagnosis.to_json()}))
        if self.rank == 0:
            render(report, console)
        write_outputs(report, self.args.json_out, self.args.junit)


def draw_plans(world: int, count: int, seed: int) -> list:
    """The plans a seeded fuzz budget draws (generation only: shrinking needs `meshsim fuzz` locally)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from .strategies import plans

    drawn: list = []
    if count <= 0:
        return drawn

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(plans(world))
    def collect(plan: Any) -> None:
        drawn.append(plan)

    collect()
    return drawn[:count]


def main(args: Any) -> int:
    import signal

    # torchrun stops the other ranks with SIGTERM when one fails; a rank stuck in a C++ wait never returns
    # to Python to run a handler, so let the default action end it at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return TorchrunRunner(args).run()
