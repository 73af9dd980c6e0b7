"""The fake executor: every rank's DeviceMesh built by torch's own code, one rank at a time, no data moved.

torch's fake process group (torch.testing._internal.distributed.fake_pg) hands each call the rank and world
size it was initialised with and returns at once, so one process can be rank r of a 16,384-rank world: it
builds the meshes, groups, coordinates and flatten/slice/unflatten results torch would build on rank r.
Two worker processes (the machine's two cores) take alternate ranks of the sample; each rank starts from a
fresh default group.

What it cannot check, and says so in the report: collective results (the fake group moves no data: they
are observed as meshsim.wire.UNMOVED) and hangs (no call ever waits).

One shortcut, for speed at scale: DeviceMesh calls new_group for every group of every dim on every rank
(2,048 calls per rank for an (8,8,8,8) mesh). For a valid group that does not contain the rank, torch's
new_group only advances the group counter; the fake tier does exactly that without running it. torch's own
code runs for every group the rank joins, for every group that is invalid, and for every new_group of the
plan itself; the process and thread tiers run it for all.
"""

from __future__ import annotations

import os
import random
import selectors
import time
import warnings
from typing import Any, Callable

from .. import deadlines
from ..ops import operation_of
from ..spec.topology import Topology
from ..wire import (DIED, FINISHED, STUCK, UNMOVED, FromRank, PlanDone, RankDied, Ready, RunPlan, RunRanks, Stop,
                    dispatch, digest_ints)
from ..spec.platform import Platform
from .generation import ClusterError, Generation
from .interpreter import Interpreter
from .rank import WorkerSpec, _capture_output, _die_with_parent, _name_process, _watch_lifeline
from .process import Cluster, absorb
from .record import RankState, RunRecord
from .threads import RankEnded

MAX_FAKE_WORLD = 1 << 20
DIGEST_OVER = 256  # mesh views larger than this travel as a digest (the model's view is digested the same way)
WORKERS = 2


class _Quiet:
    """The progress a fake rank reports to: nothing blocks, so there is nothing to follow."""

    context: Any = None
    in_plan = False

    def emit(self, event: Any) -> None:
        pass

    def forget_groups(self) -> None:
        pass


class FakeInterpreter(Interpreter):
    def view_of(self, mesh: Any) -> Any:
        tensor = mesh.mesh
        if tensor.numel() <= DIGEST_OVER:
            return tensor.tolist()
        import torch

        return digest_ints(tensor.to(torch.int64).contiguous().numpy().tobytes(), list(tensor.shape))

    def step(self, st: Any, args: dict) -> Any:
        if operation_of(st).role == "dtensor":
            # DTensor's functional collectives resolve groups by name, and this process re-creates the world for
            # each rank it plays: a later rank's names point at groups of an earlier one. Not checked here.
            return UNMOVED
        return super().step(st, args)

    def exit(self, code: int) -> None:
        raise RankEnded(code)

    def kill(self) -> None:
        raise RankEnded(-9)

    @staticmethod
    def device_of(device_type: str) -> Any:
        return None  # nothing is moved, so no tensor needs a device (there may be no CUDA on this machine)

    def moved(self, value: Any) -> Any:
        return UNMOVED  # torch's collective still ran (its argument checks are real); its result is meaningless


def _skip_non_member_groups(rank_of: Callable[[], int]) -> None:
    """DeviceMesh's new_group: a valid group without this rank only advances torch's group counter."""
    import torch.distributed.device_mesh as dm
    import torch.distributed.distributed_c10d as c10d

    real = dm.new_group

    def new_group(ranks: Any = None, *args: Any, use_local_synchronization: bool = False, **kwargs: Any) -> Any:
        if ranks is not None and not use_local_synchronization:
            world = c10d._world.default_pg.size()
            if (rank_of() not in ranks and len(set(ranks)) == len(ranks) <= world
                    and min(ranks) >= 0 and max(ranks) < world):
                c10d._world.group_count += 1
                return c10d.GroupMember.NON_GROUP_MEMBER
        return real(ranks, *args, use_local_synchronization=use_local_synchronization, **kwargs)

    dm.new_group = new_group


def fake_worker_main(spec: WorkerSpec, conn: Any, lifeline: Any) -> None:
    _die_with_parent()
    _watch_lifeline(lifeline)
    _name_process(f"meshsim-fake{spec.rank}")
    warnings.simplefilter("ignore")
    _capture_output(spec.output_file)
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    world = spec.hosts * spec.devices_per_host
    current = [0]
    _skip_non_member_groups(lambda: current[0])
    conn.send(Ready(os.getpid()))

    def run(message: RunRanks) -> None:
        for rank in message.ranks:
            current[0] = rank
            dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
            interpreter = FakeInterpreter(rank, world, "cpu", _Quiet())
            try:
                observations, end, end_step = interpreter.run(message.plan)
                result: Any = PlanDone(observations, end, end_step, c10d._world.group_count)
            except RankEnded as ended:
                result = RankDied(ended.code)
            finally:
                interpreter.handles.clear()
                dist.destroy_process_group()
            conn.send(FromRank(rank, result))

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(3)
        dispatch(message, {RunRanks: run, Stop: lambda m: os._exit(0)})


def sample_ranks(topology: Topology, count: int | None, seed: int = 0) -> list[int]:
    """Every rank, or `count` of them: every host's first and last rank, then a seeded spread of the rest."""
    world = topology.world
    if count is None or count >= world:
        return list(range(world))
    d = topology.devices_per_host
    must = sorted({r for h in range(topology.hosts) for r in (h * d, h * d + d - 1)})
    if count < len(must):  # fewer than two a host: hosts' edges spread evenly, the world's ends included
        step = (len(must) - 1) / max(1, count - 1)
        return sorted({must[round(i * step)] for i in range(count)})
    rest = sorted(set(range(world)) - set(must))
    extra = random.Random(seed).sample(rest, max(0, min(len(rest), count - len(must))))
    return sorted(must + extra)


class FakeExecutor(Cluster):
    """Each rank of a large world, alone, on torch's fake process group (see the module's docstring).

    The process tier's life cycle (workers, reaper, deadlines, restarts); its own way to hand out ranks and to
    follow them: a worker hosts many ranks in turn, and nothing waits, so a deadline bounds each rank's run.
    """

    tier = "fake"
    max_world = MAX_FAKE_WORLD
    platform = Platform("cpu", True)  # the fake backend skips DeviceMesh's device setup, so "cuda" meshes build
    worker_target = staticmethod(fake_worker_main)

    def __init__(self, topology: Topology, deadline: float = deadlines.PLAN_S,
                 start_timeout: float = deadlines.START_S, ranks: int | None = None, seed: int = 0,
                 workers: int = WORKERS):
        if ranks is not None and ranks < 1:
            raise ClusterError(f"--ranks must be at least 1, got {ranks}")
        super().__init__(topology, deadline=deadline, start_timeout=start_timeout)
        self.sample = sample_ranks(topology, ranks, seed)
        self.workers = max(1, min(workers, len(self.sample)))
        self._shares: list[list[int]] = []

    def _worker_specs(self, number: int) -> list[WorkerSpec]:
        return [WorkerSpec(i, self.topology.hosts, self.topology.devices_per_host, self.port, f"g{number}/", "fake",
                           os.path.join(self._tmp.name, f"stacks-{number}-{i}"),
                           os.path.join(self._tmp.name, f"output-{number}-{i}"), self.start_timeout)
                for i in range(self.workers)]

    def _send(self, generation: Generation, work: Any) -> None:
        if not isinstance(work, RunPlan):
            raise ClusterError("the fake tier runs plans only (a user function needs the process or thread tier)")
        self._shares = [self.sample[i::self.workers] for i in range(self.workers)]
        for worker, share in zip(generation.workers, self._shares):
            worker.conn.send(RunRanks(work.plan, work.deadline, share))

    def _between_runs(self, generation: Generation, record: RunRecord) -> None:
        pass  # every rank started from a fresh default group and destroyed it

    def _stacks(self, generation: Generation, ranks: list[int]) -> dict[int, str]:
        """A stuck worker's stack belongs to the first rank it had not finished."""
        first = {i: next(r for r in share if r in ranks) for i, share in enumerate(self._shares)
                 if any(r in ranks for r in share)}
        dumps = generation.stacks(list(first))
        return {first[i]: text for i, text in dumps.items()}

    def _follow(self, generation: Generation, started: float, deadline: float) -> RunRecord:
        """Collect each rank's result; a worker silent for longer than `deadline` leaves its ranks stuck."""
        states = [RankState(r) for r in range(self.world)]
        queues = {w.rank: list(share) for w, share in zip(generation.workers, self._shares)}
        heard = {w.rank: time.monotonic() for w in generation.workers}
        with selectors.DefaultSelector() as selector:
            for worker in generation.workers:
                selector.register(worker.conn, selectors.EVENT_READ, worker)
            while any(queues.values()):
                now = time.monotonic()
                if any(q and now - heard[w] > deadline for w, q in queues.items()):
                    break
                left = min(heard[w] + deadline - now for w, q in queues.items() if q)
                for key, _ in selector.select(timeout=max(0.01, left)):
                    worker = key.data
                    try:
                        while worker.readable():
                            tagged = worker.conn.recv()
                            absorb(states[tagged.rank], tagged.message)
                            queues[worker.rank].remove(tagged.rank)
                            heard[worker.rank] = time.monotonic()
                    except (EOFError, OSError):
                        for rank in queues[worker.rank]:
                            states[rank].end = DIED
                        queues[worker.rank] = []
                        selector.unregister(worker.conn)
        waiting = {r for q in queues.values() for r in q}
        for rank in waiting:
            states[rank].end = STUCK
        for rank in set(range(self.world)) - set(self.sample):
            states[rank].end, states[rank].done = FINISHED, True  # not run: not judged (observations None)
        record = RunRecord(self.world, deadline, states, time.monotonic() - started, bool(waiting),
                           tier=self.tier, checked=None if len(self.sample) == self.world else list(self.sample),
                           moves_data=False)
        record.notes.append("fake tier: collective results are not checked (torch's fake process group moves "
                            "no data), and hangs cannot happen (no call waits)")
        if record.checked is not None:
            record.notes.append(f"fake tier: {len(self.sample)} of {self.world} ranks checked (hosts' first "
                                "and last ranks first, then a seeded spread of the rest)")
        return record
