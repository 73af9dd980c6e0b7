"""The fake executor: every rank's DeviceMesh built by torch's own code, one rank at a time, no data moved.

torch's fake process group (torch.testing._internal.distributed.fake_pg) hands each call the rank and world
size it was initialised with and returns at once, so one process can be rank r of a 16,384-rank world: it
builds the meshes, groups, coordinates and flatten/slice/unflatten results torch would build on rank r.
Two worker processes (the machine's two cores) take alternate ranks of the sample; each rank starts from a
fresh default group.

What it cannot check, and says so in the report: collective results and DTensor values (the fake group moves
no data: they are observed as meshsim.core.wire.UNMOVED) and hangs (no call ever waits). DTensor steps are checked
for what needs no data: every rank's local shape, global offset and placements, and the collectives a
distribute, redistribute or full_tensor issues, as torch's CommDebugMode counts them.

One shortcut, for speed at scale: DeviceMesh calls new_group for every group of every dim on every rank
(6,144 calls per rank for a (16,16,8,8) mesh), so a rank's cost grew with the world. For a valid group that
does not contain the rank, torch's new_group only advances the group counter; the fake tier does exactly that,
for all such groups of a dim at once, from the dim's groups as one tensor (where the rank's group is, and the
first group new_group would refuse). torch's own code runs for every group the rank joins, for every group that
is invalid, and for every new_group of the plan itself; the process and thread tiers run it for all. A rank
costs the same at 4,096 ranks as at 16,384.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from collections.abc import Callable
from typing import Any

from ..compat import patching, tiers  # noqa: F401 -- importing tiers registers its patches
from ..compat.progress import Progress
from ..core import deadlines
from ..core.errors import ClusterError
from ..core.record import RankState, RunRecord, RunStatus
from ..core.wire import (
    FINISHED,
    STUCK,
    UNMOVED,
    FromRank,
    PlanDone,
    RankDied,
    Ready,
    RunPlan,
    RunRanks,
    Stop,
    digest_ints,
    dispatch,
    encoded,
    is_error,
)
from ..ops import operation_of
from ..spec.platform import Platform
from ..spec.tiers import TIERS, TierError
from ..spec.topology import Topology
from .follow import Hosted, follow
from .generation import Generation
from .interpreter import Interpreter
from .pool import Pooled, WorkerPool
from .rank import (
    WorkerSpec,
    _capture_output,
    _die_with_parent,
    _name_process,
    _watch_lifeline,
)
from .threads import RankEnded

DIGEST_OVER = 256  # mesh views larger than this travel as a digest (the model's view is digested the same way)
COUNTED = ("distribute", "redistribute", "full_tensor")  # DTensor steps whose collectives are counted
WORKERS = 2
BY_CLASS_OVER = 1024  # worlds larger than this are predicted by rank class


class _Quiet(Progress):
    """The progress a fake rank reports to: nothing blocks, so there is nothing to follow."""

    def __init__(self) -> None:
        super().__init__(lambda event: None)

    def emit(self, event: Any, at_once: bool = False) -> None:
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
        """A DTensor step runs as on any tier, with no data moved: its local shapes and offsets are torch's, its
        values are not (UNMOVED), and the collectives it issues are counted by torch's CommDebugMode."""
        if operation_of(st).role != "dtensor":
            return super().step(st, args)
        from torch.distributed.tensor.debug import CommDebugMode

        with CommDebugMode() as comms:
            observed = super().step(st, args)
        if st.op in COUNTED and isinstance(observed, dict) and not is_error(observed):
            observed = dict(observed, comms={str(op).rpartition(".")[2]: n
                                             for op, n in sorted(comms.get_comm_counts().items(), key=str)})
        return observed

    def values_of(self, tensor: Any) -> Any:
        return UNMOVED  # nothing moved: a DTensor's values here are whatever torch allocated

    def exit(self, code: int) -> None:
        raise RankEnded(code)

    def kill(self) -> None:
        raise RankEnded(-9)

    @staticmethod
    def device_of(device_type: str) -> Any:
        return None  # nothing is moved, so no tensor needs a device (there may be no CUDA on this machine)

    def moved(self, value: Any) -> Any:
        return UNMOVED  # torch's collective still ran (its argument checks are real); its result is meaningless


def fake_worker_main(spec: WorkerSpec, conn: Any, lifeline: Any) -> None:
    _die_with_parent()
    _watch_lifeline(lifeline)
    _name_process(f"meshsim-fake{spec.rank}")
    warnings.simplefilter("ignore")
    _capture_output(spec.output_file)
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import torch.distributed.tensor.debug  # noqa: F401 -- CommDebugMode, whose import pulls in inductor: not per rank
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from .interpreter import forget_dtensor_caches

    torch.set_num_threads(1)
    world = spec.hosts * spec.devices_per_host
    current = [0]
    patching.install("fake.skip-non-member-groups", lambda: current[0])
    patching.install("ranks-in-one-process.transform-infos")
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
                forget_dtensor_caches()  # they hold meshes and group names of the world just destroyed
                dist.destroy_process_group()
            conn.send_bytes(encoded(FromRank(rank, result)))

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


class FakeExecutor(Pooled):
    """Each rank of a large world, alone, on torch's fake process group (see the module's docstring).

    A worker plays its share of the ranks one after another, and nothing waits, so a deadline bounds each rank's
    run (from the worker's last message), not the whole sample's.
    """

    tier = "fake"
    capabilities = TIERS["fake"]
    watch: Callable[[RunStatus], None] | None = None  # told how many ranks are checked so far (a progress bar)
    platform = Platform("cpu", True)  # the fake backend skips DeviceMesh's device setup, so "cuda" meshes build

    def __init__(self, topology: Topology, deadline: float | None = None,
                 start_timeout: float | None = None, ranks: int | None = None, seed: int = 0,
                 workers: int = WORKERS):
        if ranks is not None and ranks < 1:
            raise ClusterError(f"--ranks must be at least 1, got {ranks}")
        if ranks is not None and ranks > topology.world:
            raise ClusterError(f"--ranks {ranks} is more than the {topology.world} ranks of {topology}")
        self.topology = topology
        self.deadline, self.start_timeout = deadlines.for_tier(self.tier, topology.world, deadline, start_timeout)
        self.sample = sample_ranks(topology, ranks, seed)
        self.workers = max(1, min(workers, len(self.sample)))
        self._shares: list[list[int]] = []
        self.pool = WorkerPool(self._specs, fake_worker_main, self.start_timeout)

    @property
    def world(self) -> int:
        return self.topology.world

    @property
    def by_class(self) -> bool:
        """Predict a large world by rank classes (meshsim.model.classes): the ranks checked here are asked about by
        index, and each of them gets its own exact prediction; the rest cost what their classes cost (16,384
        ranks rank by rank took 15 s of model time for a 5-step DTensor plan)."""
        return self.world > BY_CLASS_OVER

    def _specs(self, number: int, tmp: str, port: int) -> list[WorkerSpec]:
        return [WorkerSpec(i, self.topology.hosts, self.topology.devices_per_host, port, f"g{number}/", "fake",
                           os.path.join(tmp, f"stacks-{number}-{i}"), os.path.join(tmp, f"output-{number}-{i}"),
                           self.start_timeout)
                for i in range(self.workers)]

    def execute(self, work: Any, meanwhile: Callable[[], Any] | None = None,
                if_hangs: Callable[[], float | None] | None = None) -> RunRecord:
        if not isinstance(work, RunPlan):
            raise TierError("the fake tier runs plans only (a user function needs the process or thread tier)")
        generation = self.pool.current()
        started = time.monotonic()
        self._shares = [self.sample[i::self.workers] for i in range(self.workers)]
        for worker, share in zip(generation.workers, self._shares):
            worker.conn.send(RunRanks(work.plan, work.deadline, share))
        if meanwhile is not None:
            meanwhile()
        states = [RankState(r) for r in range(self.world)]
        hosted = [Hosted(w, list(share)) for w, share in zip(generation.workers, self._shares)]
        stuck, stopped = follow(hosted, states, started, work.deadline, from_last_message=True, watch=self.watch)
        for rank in stuck:
            states[rank].end = STUCK
        for rank in set(range(self.world)) - set(self.sample):
            states[rank].end, states[rank].done = FINISHED, True  # not run: not judged (observations None)
        record = RunRecord(self.world, work.deadline, states, time.monotonic() - started, bool(stuck),
                           tier=self.tier, stopped=stopped,
                           checked=None if len(self.sample) == self.world else list(self.sample),
                           moves_data=False)
        record.notes.append("fake tier: collective results and DTensor values are not checked (torch's fake "
                            "process group moves no data; DTensor local shapes, offsets and collectives are), and "
                            "hangs cannot happen (no call waits)")
        if record.checked is not None:
            record.notes.append(f"fake tier: {len(self.sample)} of {self.world} ranks checked (hosts' first "
                                "and last ranks first, then a seeded spread of the rest)")
        if record.timed_out or record.died:
            record.stacks = self._stacks(generation, record.stuck)
            self.pool.refresh()
        return record

    def _stacks(self, generation: Generation, ranks: list[int]) -> dict[int, str]:
        """A stuck worker's stack belongs to the first rank it had not finished."""
        first = {i: next(r for r in share if r in ranks) for i, share in enumerate(self._shares)
                 if any(r in ranks for r in share)}
        dumps = generation.stacks(list(first))
        return {first[i]: text for i, text in dumps.items()}
