"""Live progress events from a rank, emitted *before* every call that can block.

A rank stuck inside C++ (a gloo connect, a recv) can no longer say anything, so every collective and every
group creation announces itself first (meshsim.wire: StepBegun, CallBegun, CallReturned, FunctionBegun,
MeshBuilt). They are installed around torch.distributed itself, so users' own code is followed too.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..wire import Batch, CallBegun, CallReturned, MeshBuilt

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv",
)


class Progress:
    """Where this rank is; forwards every event to `send` (a pipe to the controller, or the store)."""

    def __init__(self, send: Callable[[Any], None]):
        self._send = send
        self._lock = threading.Lock()
        self.context: tuple | None = None  # (mesh handle, dim) of the plan step's current call
        self.in_plan = False  # inside a plan every blocking call is announced: "returned" can wait for the next
        self._returned = False
        self.seq: dict[str, int] = {}
        self.group_info: dict[int, tuple[tuple[int, ...], str]] = {}  # id(group) -> (ranks, name)
        self.mesh_dims: dict[str, tuple] = {}  # group name -> (mesh label, dim, coordinate) seen through get_group
        self.last_asked: dict[str, tuple[int, Any]] = {}  # group name -> (id of the mesh, dim) that named it last

    def forget_groups(self) -> None:
        """Drop cached group descriptions (ids of destroyed groups get reused)."""
        self.group_info.clear()
        self.mesh_dims.clear()
        self.last_asked.clear()

    def emit(self, event: Any) -> None:
        with self._lock:
            if self._returned:
                self._returned = False
                event = Batch((CallReturned(), event))
            self._send(event)

    def call(self, kind: str, ranks: tuple[int, ...], group: str, sizes: str | None = None) -> None:
        n = self.seq.get(group, 0)
        self.seq[group] = n + 1
        # Inside a plan the step locates the call; in user code, the line that made it does (the judge aligns
        # the members' call sequences of a group by it, to tell a skipped call from a late one).
        site = None if self.in_plan else user_site()
        self.emit(CallBegun(kind, ranks, group, n, self.context or self.mesh_dims.get(group), site, sizes))

    def creating(self, ranks: tuple[int, ...], name: str, desc: str | None) -> None:
        self.emit(CallBegun("new_group", ranks, name, 0, (self.context[0] if self.context else None, desc)))

    def returned(self) -> None:
        # Inside a plan the next message (a call, a step) always comes before the rank can block again, so
        # "returned" rides with it: a third fewer messages. User code may block anywhere: it is told at once.
        if self.in_plan:
            self._returned = True
        else:
            self.emit(CallReturned())

    def failed(self, exc: BaseException) -> None:
        """The call raised: the judge tells a rank whose collective failed because a peer left from the one
        that left."""
        self._returned = False
        self.emit(CallReturned(f"{type(exc).__name__}: {exc}"[:500]))

    def end_plan(self) -> None:
        """The plan's result follows: a pending "returned" is moot (the rank has finished)."""
        self.in_plan = self._returned = False


def _plumbing() -> tuple[tuple[str, ...], str]:
    """Where code that is not the user's lives: torch, meshsim (but for its example scripts), the standard library
    and the packages that carry functions to the ranks."""
    import sysconfig

    import dill
    import multiprocess
    import torch

    meshsim_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [os.path.dirname(str(m.__file__)) for m in (torch, dill, multiprocess)]
    dirs += [meshsim_dir, sysconfig.get_paths()["stdlib"]]
    return tuple(d + os.sep for d in dirs), os.path.join(meshsim_dir, "examples") + os.sep


_PLUMBING: tuple[tuple[str, ...], str] | None = None


def user_site() -> str | None:
    """The innermost frame of the user's own code: "train.py:42" (None: the call came from no user code)."""
    global _PLUMBING
    if _PLUMBING is None:
        _PLUMBING = _plumbing()
    plumbing, examples = _PLUMBING
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(examples) or not (path.startswith(plumbing) or path.startswith("<frozen")):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def tensor_sizes(args: tuple[Any, ...]) -> str | None:
    """The tensors a collective was given (its first argument: a tensor, or a list of them), as "float32[2, 4]":
    members that pass other sizes to one collective are a hang, or wrong values, on gloo."""
    first = args[0] if args else None
    tensors = first if isinstance(first, (list, tuple)) else [first]
    shown = []
    for t in tensors[:4]:
        shape, dtype = getattr(t, "shape", None), getattr(t, "dtype", None)
        if shape is None or dtype is None:
            return None
        shown.append(f"{str(dtype).removeprefix('torch.')}{list(shape)}")
    return ",".join(shown) + (",..." if len(tensors) > 4 else "")


_default: Progress | None = None  # the process's rank
_local = threading.local()  # a thread's rank, where ranks are threads (meshsim.run.threads)


def current() -> Progress:
    """The progress of the rank running on this thread (install() has run: every hook that asks is installed)."""
    found = getattr(_local, "progress", None) or _default
    assert found is not None, "meshsim's progress hooks ran before install()"
    return found


def bind_thread(progress: Progress) -> None:
    """This thread is a rank of its own: its calls report to `progress` (install() must have run)."""
    _local.progress = progress


def _remember_mesh_dim(mesh: Any, dim: Any, group: Any) -> None:
    """Any code that asks a DeviceMesh for a dim's group teaches us which mesh dim that group is (the last to ask
    names it; the same mesh asking of the same dim again, as a plan's check does, changes nothing)."""
    progress = current()
    name = str(group.group_name)
    if progress.last_asked.get(name) == (id(mesh), dim):
        return
    progress.last_asked[name] = (id(mesh), dim)
    known = progress.mesh_dims
    names = mesh.mesh_dim_names
    label = "mesh(" + ",".join(names) + ")" if names else f"mesh{tuple(mesh.shape)}"
    if dim is None:
        dim = 0
    index = names.index(dim) if isinstance(dim, str) and names and dim in names else dim
    coordinate = mesh.get_coordinate()
    pattern = None
    if coordinate is not None and isinstance(index, int) and -len(coordinate) <= index < len(coordinate):
        pattern = list(coordinate)
        pattern[index] = "*"
    known[str(group.group_name)] = (label, dim if dim is not None else index, pattern)


def install(progress: Progress) -> None:
    """Route every torch.distributed collective and group creation in this process through `progress`."""
    global _default
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if _default is not None:
        _default = progress
        return
    _default = progress

    def describe(group: Any) -> tuple[tuple[int, ...], str]:
        if group is None or group is c10d.GroupMember.WORLD:
            group = c10d._get_default_group()
        key = id(group)
        group_info = current().group_info
        info = group_info.get(key)
        if info is None:
            try:
                info = (tuple(c10d.get_process_group_ranks(group)), str(group.group_name))
            except Exception:  # not a member, or already destroyed: still worth reporting
                info = ((), repr(group))
            group_info[key] = info
        return info

    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapped = _wrap_collective(name, original, describe)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)

    original_new = c10d._new_group_with_tag

    @functools.wraps(original_new)
    def new_group_with_tag(ranks=None, *args, **kwargs):
        members = tuple(sorted(ranks)) if ranks is not None else tuple(range(c10d.get_world_size()))
        progress = current()
        progress.creating(members, str(c10d._world.group_count), kwargs.get("group_desc"))
        try:
            group = original_new(ranks, *args, **kwargs)
        except BaseException as exc:
            progress.failed(exc)
            raise
        progress.returned()
        return group

    c10d._new_group_with_tag = new_group_with_tag

    from torch.distributed.device_mesh import DeviceMesh

    original_get_group = DeviceMesh.get_group

    @functools.wraps(original_get_group)
    def get_group(self, mesh_dim=None):
        group = original_get_group(self, mesh_dim)
        try:
            _remember_mesh_dim(self, mesh_dim, group)
        except Exception:
            pass
        return group

    DeviceMesh.get_group = get_group  # type: ignore[method-assign]

    original_init_groups = DeviceMesh._init_process_groups

    def init_process_groups(layout, rank_map, mesh_dim_names, backend_override):
        try:
            ranks = tuple(layout.remap_to_tensor(rank_map).flatten().tolist())
            names = tuple(mesh_dim_names) if mesh_dim_names else None
            current().emit(MeshBuilt(tuple(layout.top_level_sizes), names, ranks))
        except Exception:
            pass
        return original_init_groups(layout, rank_map, mesh_dim_names, backend_override)

    DeviceMesh._init_process_groups = staticmethod(init_process_groups)  # type: ignore[method-assign]


def _wrap_collective(name: str, original: Callable, describe: Callable) -> Callable:
    params = list(inspect.signature(original).parameters)
    index = params.index("group") if "group" in params else None

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if getattr(_local, "inside", False):
            # torch re-enters the public collective through a TorchFunctionMode (handle_torch_function calls the
            # mode, which calls the public API again): one call, counted once
            return original(*args, **kwargs)
        group = kwargs.get("group")
        if group is None and index is not None and len(args) > index:
            group = args[index]
        ranks, group_name = describe(group)
        progress = current()
        progress.call(name, ranks, group_name, None if progress.in_plan else tensor_sizes(args))
        _local.inside = True
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            progress.failed(exc)
            raise
        finally:
            _local.inside = False
        progress.returned()
        return result

    return wrapper
