"""Live progress events from a rank, emitted *before* every call that can block.

A rank stuck inside C++ (a gloo connect, a recv) can no longer say anything, so every collective and every
group creation announces itself first (meshsim.core.wire: StepBegun, CallBegun, CallReturned, FunctionBegun,
MeshBuilt). They are installed around torch.distributed itself, so users' own code is followed too.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..core.wire import RECVS, SENDS, Batch, CallBegun, CallDone, CallReturned, MeshBuilt

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_gather_single",
    "all_gather_coalesced", "all_reduce_coalesced", "broadcast", "broadcast_object_list", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "gather", "gather_object", "scatter", "scatter_object_list", *SENDS, *RECVS,
)


class Progress:
    """Where this rank is; forwards every event to `send` (a pipe to the controller, or the store)."""

    def __init__(self, send: Callable[[Any], None]):
        self._send = send
        self._lock = threading.Lock()
        self.context: tuple | None = None  # (mesh handle, dim) of the plan step's current call
        self.in_plan = False  # inside a plan every blocking call is announced: "returned" can wait for the next
        self._returned = False
        self._returned_at: float | None = None
        self.seq: dict[str, int] = {}
        self.group_info: dict[int, tuple[tuple[int, ...], str]] = {}  # id(group) -> (ranks, name)
        self.mesh_dims: dict[str, tuple] = {}  # group name -> (mesh label, dim, coordinate) seen through get_group
        # the handle of a call in flight (id of its Work, or the storage of a functional collective's output)
        # -> its (group, seq), and back
        self.works: dict[Any, tuple[str, int]] = {}
        self.in_flight: dict[tuple[str, int], Any] = {}
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
                event = Batch((CallReturned(time=self._returned_at), event))
            self._send(event)

    def call(self, kind: str, ranks: tuple[int, ...], group: str, sizes: str | None = None,
             context: tuple | None = None) -> tuple[str, int]:
        n = self.seq.get(group, 0)
        self.seq[group] = n + 1
        # Inside a plan the step locates the call; in user code, the line that made it does (the judge aligns
        # the members' call sequences of a group by it, to tell a skipped call from a late one).
        site = None if self.in_plan else user_site()
        context = context or self.context or self.mesh_dims.get(group)
        self.emit(CallBegun(kind, ranks, group, n, context, site, sizes))
        return group, n

    def creating(self, ranks: tuple[int, ...], name: str, desc: str | None) -> None:
        self.emit(CallBegun("new_group", ranks, name, 0, (self.context[0] if self.context else None, desc),
                            None if self.in_plan else user_site()))

    def returned(self) -> None:
        # Inside a plan the next message (a call, a step) always comes before the rank can block again, so
        # "returned" rides with it: a third fewer messages. User code may block anywhere: it is told at once.
        if self.in_plan:
            self._returned, self._returned_at = True, time.time()
        else:
            self.emit(CallReturned(time=time.time()))

    def returned_handle(self, key: tuple[str, int], handle: Any, work: Any = None) -> None:
        """The call returned a handle (a Work from async_op=True or isend; a functional collective's tensor): it
        stays in flight until the Work's future completes or a wait on the handle returns (gloo's point-to-point
        Works have no future). Said after "returned", so that a call that has completed already is not left in
        flight."""
        self._returned = False
        self.emit(CallReturned(pending=True))
        with self._lock:  # registered after it is said, and the callback after that: CallDone always comes last
            self.in_flight[key] = handle
            self.works[handle] = key
        try:
            future = work.get_future()
        except Exception:  # no Work, or Work::getFuture not implemented (gloo's send and recv)
            return
        future.add_done_callback(lambda done: self.completed(key, _error_of(done)))

    def completed(self, key: tuple[str, int], error: str | None = None) -> None:
        """A call in flight completed (from the backend's thread, or a wait); said once."""
        with self._lock:
            if key not in self.in_flight:
                return
            work = self.in_flight.pop(key)
            if self.works.get(work) == key:
                del self.works[work]
        self.emit(CallDone(key[0], key[1], error, time.time()))

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
    if dim is None:  # a 1-D mesh's group (mesh["dp"].get_group()): its one dim, by name where it has one
        dim = names[0] if names and len(names) == 1 else 0
    index = names.index(dim) if isinstance(dim, str) and names and dim in names else dim
    coordinate = mesh.get_coordinate()
    pattern = None
    if coordinate is not None and isinstance(index, int) and -len(coordinate) <= index < len(coordinate):
        pattern = list(coordinate)
        pattern[index] = "*"
    if names and isinstance(index, int) and -len(names) <= index < len(names):
        dim = names[index]  # the dim by its name, however the code asked for it (funcol passes its index)
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

    _follow_waits(c10d.Work)
    _follow_ddp()
    _follow_functional(describe)
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
    _follow_device_mesh()


def _follow_device_mesh() -> None:
    """A group a DeviceMesh hands out is remembered with its mesh dim, and a mesh built is announced."""
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


def _call_inside(progress: Progress, original: Any, args: tuple, kwargs: dict) -> Any:
    """torch's own call, marked as inside a followed call (the calls it makes itself are not followed again); a
    failure is reported before it propagates."""
    _local.inside = True
    try:
        return original(*args, **kwargs)
    except BaseException as exc:
        progress.failed(exc)
        raise
    finally:
        _local.inside = False


def _error_of(future: Any) -> str | None:
    try:
        future.wait()  # completed already: returns at once, or raises what the call failed with
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:500]
    return None


class _BucketHook:
    """DDP's reducer all_reduces gradient buckets from C++, out of sight of torch.distributed's Python API, so a
    rank waiting for a peer's gradients would look idle. Each DDP model gets this comm hook, which does what the
    built-in one does (default_hooks.allreduce_hook: all_reduce the bucket, then divide) through the public
    all_reduce, which announces itself. A hook the user registers later takes its place (torch allows one)."""

    def __init__(self, process_group: Any):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.state, self.hook = process_group, default_hooks.allreduce_hook
        self.taken = False  # the user registered a hook of their own

    def __call__(self, _: Any, bucket: Any) -> Any:
        return self.hook(self.state, bucket)


def _follow_ddp() -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    original_init = DistributedDataParallel.__init__
    original_register = DistributedDataParallel.register_comm_hook
    original_builtin = DistributedDataParallel._register_builtin_comm_hook

    @functools.wraps(original_init)
    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        reducer = getattr(self, "reducer", None)
        if reducer is not None:  # (None: nothing to reduce, as with no parameter that requires a gradient)
            hook = _BucketHook(self.process_group)
            dist._register_comm_hook(reducer, None, hook)
            self._meshsim_bucket_hook = hook

    def ours(self) -> _BucketHook | None:
        hook = self.__dict__.get("_meshsim_bucket_hook")
        return hook if hook is not None and not hook.taken else None

    @functools.wraps(original_register)
    def register_comm_hook(self, state, hook):
        mine = ours(self)
        if mine is None:
            return original_register(self, state, hook)
        self._check_comm_hook(hook)  # what torch's register_comm_hook does, but for the reducer's registration
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks.append((hook, state))
        mine.state, mine.hook, mine.taken = state, hook, True

    @functools.wraps(original_builtin)
    def register_builtin_comm_hook(self, comm_hook_type):
        mine = ours(self)
        python = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                  dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}.get(comm_hook_type)
        if mine is None or python is None:
            return original_builtin(self, comm_hook_type)
        self.logger._set_comm_hook_name(str(comm_hook_type))
        mine.state, mine.hook, mine.taken = self.process_group, python, True

    DistributedDataParallel.__init__ = init  # type: ignore[method-assign]
    DistributedDataParallel.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    DistributedDataParallel._register_builtin_comm_hook = register_builtin_comm_hook  # type: ignore[method-assign]


# The functional collectives (torch.distributed._functional_collectives), which DTensor's redistribute and
# tensor parallelism use: they bypass the c10d API, return a tensor at once and block where it is first used.
FUNCTIONAL = (
    "broadcast", "all_reduce", "all_gather_single", "all_gather_tensor", "all_gather_tensor_autograd",
    "reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter_tensor_autograd", "all_to_all_single",
    "all_to_all_single_autograd", "permute_tensor",
)


def _follow_functional(describe: Callable) -> None:
    """Each functional collective is announced, and stays in flight until a wait_tensor on its output returns."""
    import torch.distributed._functional_collectives as funcol

    for name in FUNCTIONAL:
        original = getattr(funcol, name, None)
        if original is not None:
            setattr(funcol, name, _wrap_functional(name, original, describe))
    original_wait = funcol.wait_tensor

    @functools.wraps(original_wait)
    def wait_tensor(tensor):
        progress = current()
        key = progress.works.get(_storage(tensor))
        out = original_wait(tensor)
        if key is not None:
            progress.completed(key)
        return out

    funcol.wait_tensor = wait_tensor


def _storage(tensor: Any) -> tuple[str, int] | None:
    try:
        return ("storage", tensor.untyped_storage().data_ptr())
    except Exception:  # not a tensor with storage (fake, meta)
        return None


def _functional_group(signature: inspect.Signature, args: tuple, kwargs: dict, describe: Callable) -> Any:
    """A functional collective's group, from any form it takes (a group, its name, a mesh, (mesh, dim))."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh

    bound = signature.bind_partial(*args, **kwargs).arguments
    group: Any = bound.get("group")
    resolved = funcol._resolve_group(group, bound.get("tag", ""))
    pg = c10d._resolve_process_group(resolved) if isinstance(resolved, str) else resolved
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], DeviceMesh):
        _remember_mesh_dim(group[0], group[1], pg)
    elif isinstance(group, DeviceMesh):
        _remember_mesh_dim(group, None, pg)
    return describe(pg)


def _wrap_functional(name: str, original: Callable, describe: Callable) -> Callable:
    import torch.distributed._functional_collectives as funcol

    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if getattr(_local, "inside", False):
            return original(*args, **kwargs)
        try:
            ranks, group_name = _functional_group(signature, args, kwargs, describe)
        except Exception:  # a group torch itself will refuse: let it say so
            return original(*args, **kwargs)
        progress = current()
        key = progress.call(name, ranks, group_name, None if progress.in_plan else tensor_sizes(args))
        result = _call_inside(progress, original, args, kwargs)
        handle = _storage(result.elem) if isinstance(result, funcol.AsyncCollectiveTensor) else None
        if handle is None:  # waited on already (traced), or no tensor to wait on
            progress.returned()
        else:
            progress.returned_handle(key, handle)
        return result

    return wrapper


def _follow_waits(work_type: Any) -> None:
    """A wait on a Work completes the call in flight it stands for (gloo's isend and irecv have no future)."""
    original_wait = work_type.wait

    @functools.wraps(original_wait)
    def wait(self, *args, **kwargs):
        progress = current()
        key = progress.works.get(id(self))
        try:
            result = original_wait(self, *args, **kwargs)
        except BaseException as exc:
            if key is not None:
                progress.completed(key, f"{type(exc).__name__}: {exc}"[:500])
            raise
        if key is not None:
            progress.completed(key)
        return result

    work_type.wait = wait


def _wrap_collective(name: str, original: Callable, describe: Callable) -> Callable:
    signature = inspect.signature(original)
    params = list(signature.parameters)
    index = params.index("group") if "group" in params else None
    async_at = params.index("async_op") if "async_op" in params else None

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
        context = None
        if name in SENDS or name in RECVS:
            ranks, group_name, context = _channel(name, signature, args, kwargs, group, ranks, group_name, progress)
        key = progress.call(name, ranks, group_name, None if progress.in_plan else tensor_sizes(args), context)
        result = _call_inside(progress, original, args, kwargs)
        handed = name in ("isend", "irecv") or (async_at is not None and bool(
            kwargs.get("async_op", args[async_at] if len(args) > async_at else False)))
        if handed and result is not None and type(result).__name__ != "_IllegalWork":  # (coalesced: no Work yet)
            progress.returned_handle(key, id(result), result)
        else:
            progress.returned()
        return result

    return wrapper


def _channel(name: str, signature: inspect.Signature, args: tuple, kwargs: dict, group: Any, ranks: tuple[int, ...],
             group_name: str, progress: Progress) -> tuple[tuple[int, ...], str, tuple | None]:
    """A point-to-point call's channel: (the pair's ranks, "<group>:<src>-><dst>", the group's mesh dim); the
    group itself where the peer is not known (recv from any source)."""
    import torch.distributed.distributed_c10d as c10d

    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
        sending = name in SENDS
        peer, group_peer = (bound.get("dst"), bound.get("group_dst")) if sending else \
            (bound.get("src"), bound.get("group_src"))
        if peer is None and group_peer is not None:
            peer = c10d.get_global_rank(group or c10d._get_default_group(), group_peer)
        if peer is None:
            return ranks, group_name, None
        me = c10d.get_rank()
        src, dst = (me, int(peer)) if sending else (int(peer), me)
    except Exception:  # a call torch itself will refuse: report it on its group
        return ranks, group_name, None
    return tuple(sorted({src, dst})), f"{group_name}:{src}->{dst}", progress.mesh_dims.get(group_name)
