"""Run a plan's steps with real torch on this rank and record what it observes.

This module and meshsim.worker.main are the only code in meshsim that calls torch.distributed. Every
observation is plain JSON (lists, ints, None) so it can be compared with the model's prediction.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..model.expect import error_value
from ..model.predict import INJECTED, SKIPPED
from ..plan import Plan, Step, restrict_view
from .progress import Progress


class InjectedError(RuntimeError):
    """What a `raise` step throws."""


InjectedError.__name__ = INJECTED


class HandleError(LookupError):
    """A step names a handle that an earlier step did not produce on this rank."""


class Executor:
    """One rank's interpreter for plans; keeps the handles of the plan being run."""

    def __init__(self, rank: int, world: int, device_type: str, progress: Progress):
        self.rank = rank
        self.world = world
        self.device_type = device_type
        self.progress = progress
        self.handles: dict[str, Any] = {}

    @property
    def device(self) -> torch.device:
        return self.device_of(self.device_type)

    @staticmethod
    def device_of(device_type: str) -> torch.device:
        if device_type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def release(self, baseline: set, next_group_count: int) -> None:
        """Destroy what the last plan made, once every rank has finished it (no group is still connecting).

        Then continue group names from `next_group_count`, the same on every rank and above any name used so
        far: a plan that made ranks create different numbers of groups must not make the next plan's names
        disagree (gloo's rendezvous is keyed by the name, and a stale key from an old group leads nowhere).
        """
        import torch.distributed.distributed_c10d as c10d

        from .progress import forget_groups

        for value in list(self.handles.values()):
            for mesh in value if isinstance(value, list) else [value]:
                if isinstance(mesh, DeviceMesh):
                    root = mesh._get_root_mesh()
                    root._flatten_mapping.clear()  # a reference cycle that keeps gloo groups alive
                    root._pg_registry.clear()
        self.handles.clear()
        for pg in list(c10d._world.pg_map):
            if pg not in baseline:
                try:
                    dist.destroy_process_group(pg)
                except Exception:
                    pass
        forget_groups()
        c10d._world.group_count = next_group_count

    def run(self, plan: Plan) -> tuple[list[Any], str, int | None]:
        """Run every step meant for this rank. Returns (observations, end, end_step)."""
        observations: list[Any] = []
        for index, st in enumerate(plan.steps):
            if not st.runs_on(self.rank):
                observations.append(SKIPPED)
                continue
            self.progress.emit(("step", index, st.op, st.out, time.time()))
            try:
                observations.append(self.step(st, st.args_for(self.rank)))
            except InjectedError as exc:
                observations.append(error_value(exc))
                observations.extend([SKIPPED] * (len(plan.steps) - index - 1))
                return observations, "raised", index
            except Exception as exc:  # torch raised: an observation like any other
                if st.out:
                    self.handles.pop(st.out, None)
                observations.append(error_value(exc))
            finally:
                self.progress.context = None
        return observations, "finished", None

    def step(self, st: Step, args: dict) -> Any:
        op = st.op
        if op == "sleep":
            time.sleep(float(args["seconds"]))
            return None
        if op == "raise":
            raise InjectedError(args.get("message", ""))
        if op == "exit":
            os._exit(int(args.get("code", 1)))
        if op == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        self.progress.context = (st.out, None)
        value = getattr(self, "op_" + op)(args)
        if st.out is not None:
            self.handles[st.out] = value
        return self.shape_result(op, value)

    def shape_result(self, op: str, value: Any) -> Any:
        if isinstance(value, DeviceMesh):
            return summary(value)
        if isinstance(value, list) and value and isinstance(value[0], DeviceMesh):
            return [summary(m) for m in value]
        if op == "new_group":
            if not isinstance(value, dist.ProcessGroup):
                return None
            return {"ranks": dist.get_process_group_ranks(value), "group_rank": dist.get_rank(value)}
        return value

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

    # ------------------------------------------------------------------ mesh operations

    def op_init_device_mesh(self, a: dict) -> DeviceMesh:
        names = a.get("names")
        return init_device_mesh(a.get("device", self.device_type), tuple(a["shape"]),
                                mesh_dim_names=tuple(names) if names is not None else None)

    def op_mesh(self, a: dict) -> DeviceMesh:
        names = a.get("names")
        return DeviceMesh(a.get("device", self.device_type), a["layout"],
                          mesh_dim_names=tuple(names) if names is not None else None)

    def op_slice(self, a: dict) -> DeviceMesh:
        names = a["names"]
        return self.mesh(a["src"])[names if isinstance(names, str) else tuple(names)]

    def op_flatten(self, a: dict) -> DeviceMesh:
        return self.mesh(a["src"])._flatten(a.get("name"))

    def op_unflatten(self, a: dict) -> DeviceMesh:
        return self.mesh(a["src"])._unflatten(a["dim"], tuple(a["sizes"]), tuple(a["names"]))

    def op_concatenate(self, a: dict) -> DeviceMesh:
        return DeviceMesh._concatenate([self.mesh(ref) for ref in a["srcs"]])

    def op_from_group(self, a: dict) -> DeviceMesh:
        names = a.get("names")
        layout = a.get("layout")
        if "group" in a:
            return DeviceMesh.from_group(self.resolve(a["group"]), self.device_type, mesh=layout,
                                         mesh_dim_names=tuple(names) if names else None)
        src = self.mesh(a["src"])
        dims = a.get("dims") or list(range(src.ndim))
        groups = [src.get_group(d) for d in dims]
        if names is None and src.mesh_dim_names:
            names = [src.mesh_dim_names[d] if isinstance(d, int) else d for d in dims]
        if len(dims) == 1:
            return DeviceMesh.from_group(groups[0], src.device_type, mesh=layout,
                                         mesh_dim_names=tuple(names) if names else None)
        if layout is None:
            coordinate = src.get_coordinate()
            if coordinate is None:
                raise HandleError("this rank is not in the source mesh")
            indices = [src.mesh_dim_names.index(d) if isinstance(d, str) else d for d in dims]
            flat, shape = restrict_view(src.mesh.tolist(), tuple(coordinate), tuple(src.shape), indices)
            layout = torch.tensor(flat, dtype=torch.int).reshape(shape)
        return DeviceMesh.from_group(groups, src.device_type, mesh=layout,
                                     mesh_dim_names=tuple(names) if names else None)

    def op_all_submeshes(self, a: dict) -> list[DeviceMesh]:
        return self.mesh(a["src"])._get_all_submeshes(a["dim"])

    def op_new_group(self, a: dict) -> Any:
        return dist.new_group(list(a["ranks"]))

    # ------------------------------------------------------------------ queries and checks

    def op_query(self, a: dict) -> Any:
        mesh, dim, what = self.mesh(a["mesh"]), a.get("dim"), a["what"]
        if what == "get_group":
            return dist.get_process_group_ranks(mesh.get_group(dim))
        if what == "get_all_groups":
            return [dist.get_process_group_ranks(g) for g in mesh.get_all_groups()]
        if what == "get_local_rank":
            return mesh.get_local_rank(dim)
        if what == "get_coordinate":
            return _coordinate(mesh)
        if what == "size":
            return mesh.size(dim)
        if what == "shape":
            return list(mesh.shape)
        if what == "ndim":
            return mesh.ndim
        if what == "mesh":
            return mesh.mesh.tolist()
        return list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None

    def op_check(self, a: dict) -> Any:
        handle = a["mesh"]
        mesh = self.mesh(handle)
        obs = dict(summary(mesh), size=mesh.size(), dims=[])
        names = mesh.mesh_dim_names
        for index in range(mesh.ndim):
            entry: dict[str, Any] = {"size": mesh.size(index)}
            try:
                group = mesh.get_group(index)
            except Exception as exc:
                entry["group"] = error_value(exc)
                obs["dims"].append(entry)
                continue
            entry["group"] = dist.get_process_group_ranks(group)
            entry["local_rank"] = mesh.get_local_rank(index)
            if names:
                name = names[index]
                entry["group_by_name"] = _attempt(lambda: dist.get_process_group_ranks(mesh.get_group(name)))
                entry["local_rank_by_name"] = _attempt(mesh.get_local_rank, name)
            if a.get("collectives", True):
                self.progress.context = (handle, names[index] if names else index)
                device = self.device_of(mesh.device_type)
                entry["all_reduce"] = self.all_reduce(group, self.world, device)
                entry["all_gather"] = self.all_gather(group, device)
                entry["broadcast"] = self.broadcast(group, 0, device)
            obs["dims"].append(entry)
        obs["all_groups"] = _attempt(lambda: [dist.get_process_group_ranks(g) for g in mesh.get_all_groups()])
        return obs

    # ------------------------------------------------------------------ collectives

    def collective_group(self, a: dict) -> tuple[Any, torch.device]:
        if "group" in a:
            return self.resolve(a["group"]), self.device
        mesh = self.mesh(a["mesh"])
        dim = a.get("dim")
        self.progress.context = (a["mesh"], dim)
        return mesh.get_group(dim), self.device_of(mesh.device_type)

    def all_reduce(self, group: Any, numel: int, device: torch.device) -> Any:
        x = torch.zeros(numel, device=device)
        if self.rank < numel:
            x[self.rank] = 1
        dist.all_reduce(x, group=group)
        values = x.tolist()
        if all(v in (0.0, 1.0) for v in values):
            return [i for i, v in enumerate(values) if v == 1.0]
        return values

    def all_gather(self, group: Any, device: torch.device) -> list[int]:
        out = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, torch.tensor([self.rank], device=device), group=group)
        return [int(t.item()) for t in out]

    def broadcast(self, group: Any, src: int, device: torch.device) -> int:
        t = torch.tensor([self.rank], device=device)
        dist.broadcast(t, group=group, group_src=src)
        return int(t.item())

    def _non_member(self, group: Any) -> bool:
        return not isinstance(group, dist.ProcessGroup)

    def op_all_reduce(self, a: dict) -> Any:
        group, device = self.collective_group(a)
        return None if self._non_member(group) else self.all_reduce(group, a.get("numel", self.world), device)

    def op_all_gather(self, a: dict) -> Any:
        group, device = self.collective_group(a)
        return None if self._non_member(group) else self.all_gather(group, device)

    def op_broadcast(self, a: dict) -> Any:
        group, device = self.collective_group(a)
        return None if self._non_member(group) else self.broadcast(group, a.get("src", 0), device)

    def op_barrier(self, a: dict) -> Any:
        group, _ = self.collective_group(a)
        if not self._non_member(group):
            dist.barrier(group=group)
        return None


def summary(mesh: DeviceMesh) -> dict:
    """The cheap facts of a mesh every mesh-producing step records."""
    try:
        view: Any = mesh.mesh.tolist()
    except Exception as exc:
        view = error_value(exc)
    return {
        "shape": list(mesh.shape),
        "ndim": mesh.ndim,
        "names": list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
        "coordinate": _coordinate(mesh),
        "mesh": view,
    }


def _coordinate(mesh: DeviceMesh) -> list[int] | None:
    coordinate = mesh.get_coordinate()
    return list(coordinate) if coordinate is not None else None


def _attempt(fn, *args) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        return error_value(exc)
