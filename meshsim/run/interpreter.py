"""One rank's interpreter of plans: each step's torch part (meshsim.ops), with what it returns or raises
recorded as plain JSON observations for the verdict.

meshsim.run is the only package that calls torch.distributed; this module and meshsim.run.rank are where the
plan steps meet it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from ..compat.api import clear_redistribute_plans, clear_sharding_decisions, forget_meshes
from ..compat.progress import Progress
from ..core.wire import FINISHED, RAISED, SKIPPED, StepBegun, error_value, tensor_values
from ..ops import operation_of
from ..ops.dtensor import torch_observe
from ..ops.faults import InjectedError
from ..ops.queries import mesh_summary
from ..spec.plan import Plan, Step


def forget_dtensor_caches() -> None:
    """DTensor memoizes sharding decisions keyed by DeviceMesh equality, which ignores the process groups: the
    next plan's equal mesh would get specs that hold this plan's mesh and its destroyed groups ("Could not
    resolve the process group registered under the name 1"; Megatron-LM#7029 meets the same)."""
    # (not torch.distributed.tensor.debug's helper: importing it pulls in torch._inductor, seconds per rank)
    clear_sharding_decisions()
    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:
        clear_native()
    clear_redistribute_plans()


class HandleError(LookupError):
    """A step names a handle that an earlier step did not produce on this rank."""


class Interpreter:
    """Runs plans on one rank; keeps the handles of the plan being run."""

    HandleError = HandleError

    def __init__(self, rank: int, world: int, device_type: str, progress: Progress):
        self.rank = rank
        self.world = world
        self.device_type = device_type
        self.progress = progress
        self.handles: dict[str, Any] = {}
        self.group_base = 0

    @property
    def device(self) -> torch.device:
        return self.device_of(self.device_type)

    @staticmethod
    def device_of(device_type: str) -> torch.device:
        if device_type.startswith("cuda"):
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def release(self, baseline: set, next_group_count: int) -> None:
        """Destroy what the last plan made, once every rank has finished it (no group is still connecting).

        Then continue group names from `next_group_count`, the same on every rank and above any name used so
        far: a plan that made ranks create different numbers of groups must not make the next plan's names
        disagree (gloo's rendezvous is keyed by the name, and a stale key from an old group leads nowhere).
        """
        import torch.distributed.distributed_c10d as c10d

        forget_dtensor_caches()
        held = [v for value in self.handles.values() for v in (value if isinstance(value, list) else [value])]
        forget_meshes([mesh for mesh in held if isinstance(mesh, DeviceMesh)])
        self.handles.clear()
        for pg in list(c10d._world.pg_map):
            if pg not in baseline:
                try:
                    dist.destroy_process_group(pg)
                except Exception:
                    pass
        self.progress.forget_groups()
        c10d._world.group_count = next_group_count

    def run(self, plan: Plan) -> tuple[list[Any], str, int | None]:
        """Run every step meant for this rank. Returns (observations, end, end_step)."""
        import torch.distributed.distributed_c10d as c10d

        self.group_base = c10d._world.group_count  # the group_count step counts from here, as the model does
        observations: list[Any] = []
        for index, st in enumerate(plan.steps):
            if not st.runs_on(self.rank):
                observations.append(SKIPPED)
                continue
            self.progress.emit(StepBegun(index, st.op, st.out, time.time()))
            try:
                observations.append(self.step(st, st.args_for(self.rank)))
            except InjectedError as exc:
                observations.append(error_value(exc))
                observations.extend([SKIPPED] * (len(plan.steps) - index - 1))
                return observations, RAISED, index
            except Exception as exc:  # torch raised: an observation like any other
                if st.out:
                    self.handles.pop(st.out, None)
                observations.append(error_value(exc))
            finally:
                self.progress.context = None
        return observations, FINISHED, None

    def step(self, st: Step, args: dict) -> Any:
        self.progress.context = (st.out, None)
        value = operation_of(st).torch(self, args)
        if st.out is not None:
            self.handles[st.out] = value
        return self.observe(value)

    def observe(self, value: Any) -> Any:
        if isinstance(value, DeviceMesh):
            return mesh_summary(value, self.view_of)
        if isinstance(value, list) and value and isinstance(value[0], DeviceMesh):
            return [mesh_summary(m, self.view_of) for m in value]
        if isinstance(value, DTensor):
            return torch_observe(self, value)
        if isinstance(value, dist.ProcessGroup):
            return {"ranks": dist.get_process_group_ranks(value), "group_rank": dist.get_rank(value)}
        return value

    # ------------------------------------------------------------------ what a tier does its own way

    def view_of(self, mesh: DeviceMesh) -> Any:
        """The `mesh` property as an observation."""
        return mesh.mesh.tolist()

    def values_of(self, tensor: torch.Tensor) -> Any:
        """A tensor's values as an observation (exact, or a digest when many)."""
        return tensor_values(tensor.detach().cpu().reshape(-1).tolist())

    def moved(self, value: Any) -> Any:
        """What a collective returned, as an observation: `value()` reads it from the collective's output (the fake
        tier moves no data: nothing to read, and at 16,384 ranks reading a world-sized result cost a rank more than
        the collective)."""
        return value()

    def exit(self, code: int) -> None:
        """An `exit` fault: the rank's process ends."""
        self.progress.flush()
        os._exit(code)

    def kill(self) -> None:
        """A `kill` fault: SIGKILL, no goodbyes."""
        self.progress.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    # ------------------------------------------------------------------ handles

    def resolve(self, ref: str) -> Any:
        name, _, item = ref.partition(".")
        if name not in self.handles:
            raise HandleError(f"handle {name!r} does not exist on this rank")
        value = self.handles[name]
        if item:
            if not isinstance(value, list) or int(item) >= len(value):
                raise HandleError(f"handle {ref!r} does not exist on this rank")
            value = value[int(item)]
        return value

    def mesh(self, ref: str) -> DeviceMesh:
        value = self.resolve(ref)
        if not isinstance(value, DeviceMesh):
            raise HandleError(f"handle {ref!r} is not a mesh")
        return value
