"""NCCL over gloo: process groups a script asks NCCL for are gloo groups that keep NCCL's contract.

The two libraries check different things. NCCL counts elements where gloo compares shapes: an all_gather of 0-d
tensors into 1-element outputs, a [2, 2] input gathered into [4] outputs, an all_gather_into_tensor whose output
is stacked ([W, n]) rather than concatenated ([W * n]), a reduce_scatter_tensor from a stacked input; NCCL also
gathers outputs of different sizes (it broadcasts each rank's input into its output) and has PREMUL_SUM. gloo
refuses all of these; on a group requested as NCCL they run as NCCL runs them. The other way round, NCCL refuses
non-contiguous tensors ("Tensors must be contiguous") where gloo silently reduces the wrong elements: that is
refused here as NCCL refuses it. Groups the script asks gloo for keep gloo's contract.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from .state import ordinal


class _Groups:
    nccl_world = False  # the default group was asked for NCCL (or for no backend, which is NCCL on GPU hosts)
    gloo: set[str] = set()  # names of the groups asked for gloo explicitly
    premul: dict[int, tuple[Any, float]] = {}  # id(ReduceOp) -> (op, factor) from _make_nccl_premul_sum
    # Every group made, kept until the rank's os._exit. A gloo group's destructor joins its worker threads holding
    # the GIL, and a worker may need the GIL to finish its last work (pytorch#56297): when a DDP model that holds
    # the last reference dies with its function's locals (a script's main() returning), the rank deadlocked, in
    # about one DDP launch in six under load. A process that is about to end need not free its groups.
    kept: list[Any] = []


def _asks_nccl(backend: Any) -> bool | None:
    """True for an NCCL request, False for gloo (or another explicit backend), None when not said."""
    if backend is None or str(backend).lower() == "undefined":
        return None
    return "nccl" in str(backend).lower()


def is_nccl(group: Any) -> bool:
    import torch.distributed.distributed_c10d as c10d

    if not _Groups.nccl_world:
        return False
    if group is None or group is c10d.GroupMember.WORLD:
        return True
    return str(getattr(group, "group_name", "")) not in _Groups.gloo


class _Completed:
    """The Work of a collective meshsim has already completed (a composition of synchronous calls)."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None


def _contiguous(*tensors: Any) -> None:
    """NCCL's check_gpu_single_tensor: contiguous in the memory format the tensor's strides suggest."""
    import torch

    for tensor in tensors:
        if tensor is None or tensor.is_contiguous():
            continue
        suggested = {4: torch.channels_last, 5: torch.channels_last_3d}.get(tensor.dim())
        if suggested is None or not tensor.is_contiguous(memory_format=suggested):
            raise ValueError("Tensors must be contiguous")


def _flat(tensor: Any) -> Any:
    return tensor.view(-1) if tensor.is_contiguous() else tensor


def _all_gather(original: dict[str, Any], tensor_list: list, tensor: Any, group: Any = None,
                async_op: bool = False) -> Any:
    _contiguous(tensor)
    if all(t.shape == tensor.shape for t in tensor_list):
        return original["all_gather"](tensor_list, tensor, group=group, async_op=async_op)
    if len({t.numel() for t in tensor_list}) == 1 and tensor_list[0].numel() == tensor.numel():
        shaped = tensor.reshape(tensor_list[0].shape)  # NCCL gathers elements into a flat, stacked buffer
        return original["all_gather"](tensor_list, shaped, group=group, async_op=async_op)
    return _uneven_all_gather(original, tensor_list, tensor, group, async_op)


def _uneven_all_gather(original: dict[str, Any], tensor_list: list, tensor: Any, group: Any, async_op: bool) -> Any:
    """Outputs of different sizes: NCCL broadcasts each rank's input into that rank's output, one by one."""
    import torch.distributed.distributed_c10d as c10d

    me = c10d.get_rank(group)
    for source, output in enumerate(tensor_list):
        if source == me:
            if output.numel() != tensor.numel():
                raise ValueError("Tensor input and output of _broadcast_oop must have the same number of elements")
            output.copy_(tensor.reshape(output.shape))
        original["broadcast"](output, group_src=source, group=group)
    return _Completed() if async_op else None


def _all_gather_into_tensor(original: dict[str, Any], output_tensor: Any, input_tensor: Any, group: Any = None,
                            async_op: bool = False) -> Any:
    _contiguous(output_tensor, input_tensor)
    world = _group_size(group)
    if output_tensor.numel() != input_tensor.numel() * world:
        raise ValueError("output tensor size must be equal to world_size times input tensor size")
    return original["all_gather_into_tensor"](_flat(output_tensor), _flat(input_tensor), group=group,
                                              async_op=async_op)


def _reduce_scatter_tensor(original: dict[str, Any], output: Any, input: Any, op: Any = None, group: Any = None,
                           async_op: bool = False) -> Any:
    _contiguous(output, input)
    world = _group_size(group)
    if input.numel() != output.numel() * world:
        raise ValueError("input tensor must be the same size as output size times world size")
    op = _premultiplied(op, input)
    kwargs = {} if op is None else {"op": op}
    return original["reduce_scatter_tensor"](_flat(output), _flat(input), group=group, async_op=async_op, **kwargs)


def _group_size(group: Any) -> int:
    import torch.distributed.distributed_c10d as c10d

    return c10d.get_world_size(group)


def _premultiplied(op: Any, tensor: Any) -> Any:
    """PREMUL_SUM(factor) as NCCL computes it: every input times factor, then summed."""
    import torch.distributed as dist

    entry = _Groups.premul.get(id(op)) if op is not None else None
    if entry is None or entry[0] is not op:
        return op
    tensor.mul_(entry[1])
    return dist.ReduceOp.SUM


def _reducing(name: str, original: dict[str, Any]) -> Any:
    """all_reduce / reduce: NCCL's contiguity check and PREMUL_SUM; the rest as gloo does it."""

    def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        _contiguous(tensor)
        if "op" in kwargs:
            kwargs["op"] = _premultiplied(kwargs["op"], tensor)
        elif args and name == "all_reduce":
            args = (_premultiplied(args[0], tensor),) + args[1:]
        return original[name](tensor, *args, **kwargs)

    return call


def _checked(name: str, original: dict[str, Any]) -> Any:
    """Collectives NCCL takes as gloo does, but only for contiguous tensors."""

    def call(*args: Any, **kwargs: Any) -> Any:
        import torch

        _contiguous(*(a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)))
        return original[name](*args, **kwargs)

    return call


ADAPTED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "all_gather": lambda original: functools.partial(_all_gather, original),
    "all_gather_into_tensor": lambda original: functools.partial(_all_gather_into_tensor, original),
    "reduce_scatter_tensor": lambda original: functools.partial(_reduce_scatter_tensor, original),
    "all_reduce": lambda original: _reducing("all_reduce", original),
    "reduce": lambda original: _reducing("reduce", original),
    **{name: functools.partial(_checked, name) for name in ("broadcast", "send", "recv", "isend", "irecv",
                                                               "all_to_all_single")},
}


def _nccl_semantics(name: str, original: dict[str, Any]) -> Any:
    plain = original[name]
    adapted = ADAPTED[name](original)
    parameters = list(inspect.signature(plain).parameters)
    position = parameters.index("group") if "group" in parameters else None

    @functools.wraps(plain)
    def collective(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group")
        if group is None and position is not None and len(args) > position:
            group = args[position]
        if is_nccl(group):
            return adapted(*args, **kwargs)
        return plain(*args, **kwargs)

    return collective


def _translate(backend: Any) -> Any:
    if backend is None or str(backend).lower() == "undefined" or "nccl" in str(backend).lower():
        return "gloo"  # gloo serves the simulated GPUs' tensors, which live in CPU memory
    return backend


def _patch_group_creation(dist: Any, c10d: Any) -> None:
    original_init = c10d.init_process_group

    @functools.wraps(original_init)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        device_id = kwargs.pop("device_id", None)
        if device_id is not None:
            _check_device_id(device_id)  # as torch checks it; binding a group to a GPU is NCCL's own business
        _Groups.nccl_world = _asks_nccl(backend) is not False
        _Groups.gloo = set()
        result = original_init(_translate(backend), *args, **kwargs)
        _Groups.kept.append(c10d._get_default_group())
        return result

    original_new = c10d.new_group

    @functools.wraps(original_new)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        asked = _asks_nccl(kwargs.get("backend"))
        if "backend" in kwargs:
            kwargs["backend"] = None if asked else kwargs["backend"]
        group = original_new(*args, **kwargs)
        _Groups.kept.append(group)
        if asked is False and group is not None and group is not c10d.GroupMember.NON_GROUP_MEMBER:
            _Groups.gloo.add(str(group.group_name))
        return group

    c10d.init_process_group = dist.init_process_group = init_process_group
    c10d.new_group = dist.new_group = new_group
    import torch.distributed.device_mesh as device_mesh

    def mesh_get_backend(group: Any = None) -> Any:
        """What DeviceMesh asks to decide whether the world group can serve a whole-world dim: on NCCL it can
        (and is reused, as on GPU hosts); torch makes another group only for gloo on a GPU machine."""
        name = c10d.get_backend(group)
        return "nccl" if name == "gloo" and is_nccl(group) else name

    for name, fn in (("init_process_group", init_process_group), ("new_group", new_group),
                     ("get_backend", mesh_get_backend)):
        if hasattr(device_mesh, name):  # DeviceMesh makes its groups through names it imported
            setattr(device_mesh, name, fn)
    c10d.is_nccl_available = dist.is_nccl_available = lambda: True


def _check_device_id(device_id: Any) -> None:
    import torch

    if isinstance(device_id, int):
        device_id = torch.device("cuda", device_id)
    if device_id.type == "cuda":
        if device_id.index is None:
            raise ValueError("Please use a device_id with index.")
        try:
            ordinal(device_id)
        except RuntimeError:
            raise ValueError(f"device_id {device_id} is out of range. Please use a device index less than the "
                             f"number of accelerators available: {torch.accelerator.device_count()}.") from None


def _patch_premul(dist: Any, c10d: Any) -> None:
    if getattr(dist, "_make_nccl_premul_sum", None) is None:
        return

    def make_premul_sum(factor: Any) -> Any:
        op = dist.ReduceOp(dist.ReduceOp.SUM)  # a distinct object that stands for PREMUL_SUM(factor)
        _Groups.premul[id(op)] = (op, float(factor) if not hasattr(factor, "item") else factor)
        return op

    c10d._make_nccl_premul_sum = dist._make_nccl_premul_sum = make_premul_sum


def _patch_ddp() -> None:
    """DDP(module, device_ids=[i], output_device=i) as GPU scripts write it: the module lives in CPU memory here,
    and DDP takes device ids only for modules on GPUs, so they are checked as CUDA would and then dropped."""
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__

    @functools.wraps(original)
    def init(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, *args: Any,
             **kwargs: Any) -> None:
        for device in list(device_ids or []) + ([output_device] if output_device is not None else []):
            ordinal(device)
        original(self, module, None, None, *args, **kwargs)

    setattr(DistributedDataParallel, "__init__", init)  # noqa: B010 -- mypy refuses assigning a method


def install() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    _Groups.nccl_world, _Groups.gloo, _Groups.premul = False, set(), {}
    _patch_group_creation(dist, c10d)
    _patch_premul(dist, c10d)
    _patch_ddp()
    original = {name: getattr(c10d, name) for name in list(ADAPTED) + ["broadcast"]}
    for name in ADAPTED:
        wrapped = _nccl_semantics(name, original)
        if getattr(dist, name, None) is original[name]:
            setattr(dist, name, wrapped)
        setattr(c10d, name, wrapped)
