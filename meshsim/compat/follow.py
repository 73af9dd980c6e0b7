"""The followers: patches of torch that make every collective, wait and group creation announce itself to the
rank's Progress (meshsim.compat.progress) before it can block, so users' own code is followed too.

Each is a registered patch (meshsim.compat.patching): what it replaces, the releases it was written for, what
its wrappers read by name. Wrappers pass every argument through as they got it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ..core.wire import ROOTED, MeshBuilt, channel
from . import patching as _patching
from . import progress as _progress
from .patching import arguments, patch, wrap
from .progress import COLLECTIVES, RECVS, SENDS, Progress, current, tensor_sizes

_local = _progress._local


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


C10D = "torch.distributed.distributed_c10d"
FUNCOL = "torch.distributed._functional_collectives"
DEVICE_MESH = "torch.distributed.device_mesh.DeviceMesh"
DDP = "torch.nn.parallel.DistributedDataParallel"
# Collectives every release meshsim knows has; the others (all_gather_single, ...) are followed where they exist.
_EVERYWHERE = ("all_reduce", "all_gather", "broadcast", "barrier", "reduce", "send", "recv", "isend", "irecv")


def install(progress: Progress) -> None:
    """Route every torch.distributed collective and group creation in this process through `progress`."""
    if _progress._default is not None:
        _progress._default = progress
        return
    _progress._default = progress
    for name in FOLLOWERS:
        _patching.install(name)


def describe(group: Any) -> tuple[tuple[int, ...], str]:
    """A group's ranks and name, remembered by the group's id (None: the world)."""
    import torch.distributed.distributed_c10d as c10d

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


@patch("follow.collectives", "following where a rank waits in a torch.distributed collective",
       targets=tuple(f"{C10D}.{name}" for name in COLLECTIVES),
       optional=tuple(f"{C10D}.{name}" for name in COLLECTIVES if name not in _EVERYWHERE))
def _follow_collectives() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapped = _wrap_collective(name, original, describe)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)


@patch("follow.new-group", "following where a rank waits while it creates a process group",
       targets=(f"{C10D}._new_group_with_tag",), needs={f"{C10D}._new_group_with_tag": ("ranks",)})
def _follow_group_creation() -> None:
    import torch.distributed.distributed_c10d as c10d

    def new_group_with_tag(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        ranks = arguments(original, args, kwargs).get("ranks")
        members = tuple(sorted(ranks)) if ranks is not None else tuple(range(c10d.get_world_size()))
        progress = current()
        progress.creating(members, str(c10d._world.group_count), kwargs.get("group_desc"))
        try:
            group = original(*args, **kwargs)
        except BaseException as exc:
            progress.failed(exc)
            raise
        progress.returned()
        return group

    wrap(c10d, "_new_group_with_tag", new_group_with_tag)


@patch("follow.device-mesh", "naming the mesh dim of every group a DeviceMesh hands out, and the meshes built",
       targets=(f"{DEVICE_MESH}.get_group", f"{DEVICE_MESH}._init_process_groups"),
       needs={f"{DEVICE_MESH}.get_group": ("mesh_dim",)})
def _follow_device_mesh() -> None:
    import inspect

    from torch.distributed.device_mesh import DeviceMesh

    def get_group(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        group = original(self, *args, **kwargs)
        try:
            _remember_mesh_dim(self, arguments(original, (self, *args), kwargs).get("mesh_dim"), group)
        except Exception:
            pass
        return group

    def init_process_groups(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            current().emit(_mesh_built(arguments(original, args, kwargs)))
        except Exception:
            pass
        return original(*args, **kwargs)

    wrap(DeviceMesh, "get_group", get_group)
    static = isinstance(inspect.getattr_static(DeviceMesh, "_init_process_groups"), staticmethod)
    wrap(DeviceMesh, "_init_process_groups", init_process_groups, static=static)


def _mesh_built(bound: dict[str, Any]) -> MeshBuilt:
    """The mesh a call of DeviceMesh._init_process_groups builds groups for: from its layout and rank map
    (torch >= 2.10, a static method), or from the mesh itself (2.9, a method)."""
    if "layout" in bound:
        layout, names = bound["layout"], bound.get("mesh_dim_names")
        ranks = tuple(layout.remap_to_tensor(bound["rank_map"]).flatten().tolist())
        shape = tuple(layout.top_level_sizes)
    else:
        mesh = bound["self"]
        names, ranks, shape = mesh.mesh_dim_names, tuple(mesh.mesh.flatten().tolist()), tuple(mesh.mesh.shape)
    return MeshBuilt(shape, tuple(names) if names else None, ranks)


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


@patch("follow.ddp", "following DDP's gradient buckets, which its reducer all_reduces from C++",
       targets=(f"{DDP}.__init__", f"{DDP}.register_comm_hook", f"{DDP}._register_builtin_comm_hook",
                "torch.distributed._register_comm_hook"),
       needs={f"{DDP}.register_comm_hook": ("state", "hook"),
              f"{DDP}._register_builtin_comm_hook": ("comm_hook_type",)})
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


@patch("follow.functional", "following DTensor's and tensor parallelism's functional collectives until waited on",
       targets=tuple(f"{FUNCOL}.{name}" for name in FUNCTIONAL) + (f"{FUNCOL}.wait_tensor",
                                                                   f"{FUNCOL}._resolve_group_name"),
       optional=(f"{FUNCOL}.all_gather_single", f"{FUNCOL}.reduce_scatter_single"))
def _follow_functional() -> None:
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


def _argument(name: str, at: int | None, args: tuple, kwargs: dict, default: Any) -> Any:
    """An argument by keyword or at its position (binding the signature on every call was a tenth of what the
    followers cost a rank in a sweep)."""
    if name in kwargs:
        return kwargs[name]
    return args[at] if at is not None and len(args) > at else default


def _functional_group(places: tuple[int | None, int | None], args: tuple, kwargs: dict, describe: Callable) -> Any:
    """A functional collective's group, from any form it takes (a group, its name, a mesh, (mesh, dim));
    `places`: the positions of its group and tag parameters."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh

    group: Any = _argument("group", places[0], args, kwargs, None)
    pg = c10d._resolve_process_group(funcol._resolve_group_name(group, _argument("tag", places[1], args, kwargs, "")))
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], DeviceMesh):
        _remember_mesh_dim(group[0], group[1], pg)
    elif isinstance(group, DeviceMesh):
        _remember_mesh_dim(group, None, pg)
    return describe(pg)


def _wrap_functional(name: str, original: Callable, describe: Callable) -> Callable:
    import torch.distributed._functional_collectives as funcol

    params = list(inspect.signature(original).parameters)
    group_at, tag_at = (params.index(p) if p in params else None for p in ("group", "tag"))
    places = (group_at, tag_at)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if getattr(_local, "inside", False):
            return original(*args, **kwargs)
        try:
            ranks, group_name = _functional_group(places, args, kwargs, describe)
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


@patch("follow.waits", "completing a call in flight when its Work is waited on",
       targets=(f"{C10D}.Work.wait",))
def _follow_waits() -> None:
    """A wait on a Work completes the call in flight it stands for (gloo's isend and irecv have no future)."""
    import torch.distributed.distributed_c10d as c10d

    def wait(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        progress = current()
        key = progress.works.get(id(self))
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            if key is not None:
                progress.completed(key, f"{type(exc).__name__}: {exc}"[:500])
            raise
        if key is not None:
            progress.completed(key)
        return result

    wrap(c10d.Work, "wait", wait)


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
        root = _root(name, signature, args, kwargs, group) if name in ROOTED and not progress.in_plan else None
        key = progress.call(name, ranks, group_name, None if progress.in_plan else tensor_sizes(args), context, root)
        result = _call_inside(progress, original, args, kwargs)
        handed = name in ("isend", "irecv") or (async_at is not None and bool(
            kwargs.get("async_op", args[async_at] if len(args) > async_at else False)))
        if handed and result is not None and type(result).__name__ != "_IllegalWork":  # (coalesced: no Work yet)
            progress.returned_handle(key, id(result), result)
        else:
            progress.returned()
        return result

    return wrapper


def _root(name: str, signature: inspect.Signature, args: tuple, kwargs: dict, group: Any) -> int | None:
    """A rooted collective's root as a global rank (its group_src/group_dst translated); None where torch will
    refuse the call anyway."""
    import torch.distributed.distributed_c10d as c10d

    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
        arg = ROOTED[name]
        root = bound.get(arg)
        if root is None and bound.get(f"group_{arg}") is not None:
            root = c10d.get_global_rank(group or c10d._get_default_group(), bound[f"group_{arg}"])
        return None if root is None else int(root)
    except Exception:
        return None


def _channel(name: str, signature: inspect.Signature, args: tuple, kwargs: dict, group: Any, ranks: tuple[int, ...],
             group_name: str, progress: Progress) -> tuple[tuple[int, ...], str, tuple | None]:
    """A point-to-point call's channel: (the pair's ranks, its name (meshsim.core.wire.channel: the ends and the
    tag), the group's mesh dim); the group itself where the peer is not known (recv from any source)."""
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
        tag = int(bound.get("tag") or 0)
    except Exception:  # a call torch itself will refuse: report it on its group
        return ranks, group_name, None
    if tag:
        from .simgpu.collectives import is_nccl  # (a simulated GPU's NCCL group pairs in order, whatever the tag)

        tag = 0 if is_nccl(group) else tag
    return tuple(sorted({src, dst})), channel(group_name, src, dst, tag), progress.mesh_dims.get(group_name)


FOLLOWERS = ("follow.collectives", "follow.waits", "follow.ddp", "follow.functional", "follow.new-group",
             "follow.device-mesh")
