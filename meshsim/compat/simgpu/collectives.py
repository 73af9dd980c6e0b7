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
from collections.abc import Callable
from typing import Any

from ..patching import arguments, patch
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


# Each adapter takes the originals by name and the call's arguments by parameter name (as the original binds
# them), and passes on what it does not read: a parameter a release adds reaches torch untouched.
Call = dict[str, Any]


def _all_gather(original: dict[str, Any], call: Call) -> Any:
    tensor_list, tensor = call["tensor_list"], call["tensor"]
    _contiguous(tensor)
    if all(t.shape == tensor.shape for t in tensor_list):
        return original["all_gather"](**call)
    if len({t.numel() for t in tensor_list}) == 1 and tensor_list[0].numel() == tensor.numel():
        # NCCL gathers elements into a flat, stacked buffer
        return original["all_gather"](**dict(call, tensor=tensor.reshape(tensor_list[0].shape)))
    return _uneven_all_gather(original, tensor_list, tensor, call.get("group"), bool(call.get("async_op")))


def _uneven_all_gather(original: dict[str, Any], tensor_list: list[Any], tensor: Any, group: Any,
                       async_op: bool) -> Any:
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


def _all_gather_into_tensor(original: dict[str, Any], call: Call) -> Any:
    output, input = call["output_tensor"], call["input_tensor"]
    _contiguous(output, input)
    if output.numel() != input.numel() * _group_size(call.get("group")):
        raise ValueError("output tensor size must be equal to world_size times input tensor size")
    return original["all_gather_into_tensor"](**dict(call, output_tensor=_flat(output), input_tensor=_flat(input)))


def _reduce_scatter_tensor(original: dict[str, Any], call: Call, name: str = "reduce_scatter_tensor") -> Any:
    output, input = call["output"], call["input"]
    _contiguous(output, input)
    if input.numel() != output.numel() * _group_size(call.get("group")):
        raise ValueError("input tensor must be the same size as output size times world size")
    call = dict(call, output=_flat(output), input=_flat(input))
    if call.get("op") is not None:
        call["op"], call["input"] = _premultiplied(call["op"], call["input"], in_place=False)
    return original[name](**call)


def _group_size(group: Any) -> int:
    import torch.distributed.distributed_c10d as c10d

    return c10d.get_world_size(group)


def premul_factor(op: Any) -> Any:
    """The factor of a PREMUL_SUM reduce op (ReduceOp.PREMUL_SUM(f), or _make_nccl_premul_sum(f)); None for
    another op."""
    import torch.distributed as dist

    entry = _Groups.premul.get(id(op)) if op is not None else None
    if entry is not None and entry[0] is op:
        return entry[1]
    if getattr(op, "op", None) == getattr(dist.ReduceOp.RedOpType, "PREMUL_SUM", None):
        return getattr(op, "factor", None)
    return None


def _premultiplied(op: Any, tensor: Any, in_place: bool = True) -> tuple[Any, Any]:
    """PREMUL_SUM(factor) as NCCL computes it: every input times factor, then summed. An input that is not also the
    output is left as it was (NCCL reads it), and a scaled copy is reduced instead."""
    import torch.distributed as dist

    factor = premul_factor(op)
    if factor is None:
        return op, tensor
    return dist.ReduceOp.SUM, tensor.mul_(factor) if in_place else tensor * factor


def _reducing(name: str, original: dict[str, Any], call: Call) -> Any:
    """all_reduce / reduce: NCCL's contiguity check and PREMUL_SUM; the rest as gloo does it."""
    _contiguous(call["tensor"])
    if call.get("op") is not None:
        call = dict(call, op=_premultiplied(call["op"], call["tensor"])[0])
    return original[name](**call)


def _checked(name: str, original: dict[str, Any], call: Call) -> Any:
    """Collectives NCCL takes as gloo does, but only for contiguous tensors."""
    import torch

    _contiguous(*(a for a in call.values() if isinstance(a, torch.Tensor)))
    return original[name](**call)


ADAPTED: dict[str, Callable[[dict[str, Any], Call], Any]] = {
    "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "reduce_scatter_single": functools.partial(_reduce_scatter_tensor, name="reduce_scatter_single"),
    "all_reduce": functools.partial(_reducing, "all_reduce"),
    "reduce": functools.partial(_reducing, "reduce"),
    **{name: functools.partial(_checked, name) for name in ("broadcast", "send", "recv", "isend", "irecv",
                                                               "all_to_all_single")},
}
# what each adapter reads by name (meshsim.compat.patching checks them against the installed torch)
READS = {"all_gather": ("tensor_list", "tensor", "group", "async_op"),
         "all_gather_into_tensor": ("output_tensor", "input_tensor", "group"),
         "reduce_scatter_tensor": ("output", "input", "op", "group"),
         "reduce_scatter_single": ("output", "input", "op", "group"),
         "all_reduce": ("tensor", "op", "group"), "reduce": ("tensor", "op", "group")}


def _nccl_semantics(name: str, original: dict[str, Any]) -> Any:
    plain = original[name]
    adapted = ADAPTED[name]

    @functools.wraps(plain)
    def collective(*args: Any, **kwargs: Any) -> Any:
        call = arguments(plain, args, kwargs)
        if is_nccl(call.get("group")):
            return adapted(original, call)
        return plain(*args, **kwargs)

    return collective


def _translate(backend: Any) -> Any:
    if backend is None or str(backend).lower() == "undefined" or "nccl" in str(backend).lower():
        return "gloo"  # gloo serves the simulated GPUs' tensors, which live in CPU memory
    return backend


C10D = "torch.distributed.distributed_c10d"
DDP = "torch.nn.parallel.DistributedDataParallel"


@patch("nccl.groups", "NCCL's groups on gloo (a script that asks for nccl, as on GPU hosts)",
       targets=(f"{C10D}.init_process_group", f"{C10D}.new_group", f"{C10D}.is_nccl_available", f"{C10D}.split_group",
                f"{C10D}._get_split_source",
                "torch.distributed.device_mesh.init_process_group", "torch.distributed.device_mesh.new_group",
                "torch.distributed.device_mesh.get_backend", "torch.distributed.device_mesh.split_group"),
       needs={f"{C10D}.init_process_group": ("backend", "device_id"), f"{C10D}.new_group": ("backend",),
              f"{C10D}.split_group": ("parent_pg", "split_ranks", "timeout", "group_desc")},
       optional=(f"{C10D}.split_group", f"{C10D}._get_split_source", "torch.distributed.device_mesh.split_group",
                 "torch.distributed.device_mesh.init_process_group", "torch.distributed.device_mesh.new_group",
                 "torch.distributed.device_mesh.get_backend"))
def _patch_group_creation() -> None:
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.distributed_c10d as c10d

    original_init, original_new = c10d.init_process_group, c10d.new_group

    @functools.wraps(original_init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        call = arguments(original_init, args, kwargs)
        device_id = call.pop("device_id", None)
        if device_id is not None:
            device_id = _check_device_id(device_id)  # as torch checks it
        _Groups.nccl_world = _asks_nccl(call.get("backend")) is not False
        _Groups.gloo = set()
        result = original_init(**dict(call, backend=_translate(call.get("backend"))))
        default = c10d._get_default_group()
        _Groups.kept.append(default)
        if device_id is not None and device_id.type == "cuda":
            # bound as NCCL binds it (barrier and object collectives use it), after gloo's init: torch would
            # otherwise connect and split gloo's communicators for a CUDA device
            default.bound_device_id = device_id
        return result

    @functools.wraps(original_new)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        call = arguments(original_new, args, kwargs)
        asked = _asks_nccl(call.get("backend"))
        if asked:
            call["backend"] = None
        group = original_new(**call)
        _Groups.kept.append(group)
        if asked is False and group is not None and group is not c10d.GroupMember.NON_GROUP_MEMBER:
            _Groups.gloo.add(str(group.group_name))
        return group

    c10d.init_process_group = dist.init_process_group = init_process_group
    c10d.new_group = dist.new_group = new_group

    def mesh_get_backend(group: Any = None) -> Any:
        """What DeviceMesh asks to decide whether the world group can serve a whole-world dim: on NCCL it can
        (and is reused, as on GPU hosts); torch makes another group only for gloo on a GPU machine."""
        name = c10d.get_backend(group)
        return "nccl" if name == "gloo" and is_nccl(group) else name

    if hasattr(c10d, "_get_split_source"):  # a bound group's subgroups split NCCL's communicators; gloo's cannot
        original_source = c10d._get_split_source
        # torch 2.15 passes the requested backend too (pg, backend): whatever follows the group is passed on
        c10d._get_split_source = lambda pg, *rest: None if is_nccl(pg) else original_source(pg, *rest)
    split_group = _split_group(c10d.split_group, new_group) if hasattr(c10d, "split_group") else None
    if split_group is not None:
        c10d.split_group = dist.split_group = split_group
    for name, fn in (("init_process_group", init_process_group), ("new_group", new_group),
                     ("get_backend", mesh_get_backend), ("split_group", split_group)):
        if fn is not None and hasattr(device_mesh, name):  # DeviceMesh makes its groups through names it imported
            setattr(device_mesh, name, fn)
    c10d.is_nccl_available = dist.is_nccl_available = lambda: True
    if not hasattr(c10d, "ProcessGroupNCCL"):  # a CPU build of torch: code that follows from NCCL names the class
        for module in (c10d, dist):
            setattr(module, "ProcessGroupNCCL", ProcessGroupNCCL)  # noqa: B010 -- mypy knows CUDA builds' class


class ProcessGroupNCCL:
    """What a CPU build of torch lacks and its own code names once NCCL is available (`_set_pg_timeout`, abort,
    group uids: `is_nccl_available() and isinstance(backend, ProcessGroupNCCL)`). No backend is one: the simulated
    NCCL groups are gloo's, so that code takes gloo's path (a timeout set per group is gloo's timeout)."""

    class Options:
        """ProcessGroupNCCL.Options, as scripts build it for init_process_group(pg_options=...)."""

        def __init__(self, is_high_priority_stream: bool = False):
            self.is_high_priority_stream = is_high_priority_stream
            self._timeout = None
            self.config = None


def _split_group(original: Any, new_group: Any) -> Any:
    """split_group (ncclCommSplit, which DeviceMesh uses once a group is bound to a device) on the simulated NCCL
    groups: a new group for each split, made by every rank in the same order, as DeviceMesh makes them unbound.
    gloo's own split copies options it cannot copy."""
    import torch.distributed.distributed_c10d as c10d

    @functools.wraps(original)
    def split_group(*args: Any, **kwargs: Any) -> Any:
        call = arguments(original, args, kwargs)
        parent = call.get("parent_pg")
        if call.get("split_ranks") is None or not is_nccl(parent):
            return original(*args, **kwargs)
        parent = parent if parent is not None else c10d._get_default_group()
        mine = None
        for ranks in call["split_ranks"]:
            members = [c10d.get_global_rank(parent, r) for r in ranks]
            group = new_group(members, timeout=call.get("timeout"), group_desc=call.get("group_desc"))
            if c10d.get_rank() in members:
                mine = group
        return mine

    return split_group


def _check_device_id(device_id: Any) -> Any:
    """The device_id init_process_group takes, as a torch.device, once checked as torch checks it."""
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
    return device_id


@patch("nccl.premul-sum", "NCCL's PREMUL_SUM reduce op", targets=("torch.distributed._make_nccl_premul_sum",),
       optional=("torch.distributed._make_nccl_premul_sum",))
def _patch_premul() -> None:
    import torch.distributed
    import torch.distributed.distributed_c10d

    dist: Any = torch.distributed
    c10d: Any = torch.distributed.distributed_c10d

    if getattr(dist, "_make_nccl_premul_sum", None) is None:
        return

    def make_premul_sum(factor: Any) -> Any:
        op = dist.ReduceOp(dist.ReduceOp.SUM)  # a distinct object that stands for PREMUL_SUM(factor)
        _Groups.premul[id(op)] = (op, float(factor) if not hasattr(factor, "item") else factor)
        return op

    c10d._make_nccl_premul_sum = dist._make_nccl_premul_sum = make_premul_sum


@patch("nccl.ddp-devices", "DDP(module, device_ids=[i]) as GPU scripts write it",
       targets=(f"{DDP}.__init__",), needs={f"{DDP}.__init__": ("module", "device_ids", "output_device")})
def _patch_ddp() -> None:
    """DDP(module, device_ids=[i], output_device=i) as GPU scripts write it: the module lives in CPU memory here,
    and DDP takes device ids only for modules on GPUs, so they are checked as CUDA would and then dropped."""
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        call = arguments(original, (self, *args), kwargs)
        for device in list(call.get("device_ids") or []) + [call.get("output_device")]:
            if device is not None:
                ordinal(device)
        original(**dict(call, device_ids=None, output_device=None))

    setattr(DistributedDataParallel, "__init__", init)  # noqa: B010 -- mypy refuses assigning a method


@patch("nccl.collectives", "NCCL's element-counting contract, contiguity check and PREMUL_SUM on gloo",
       targets=tuple(f"{C10D}.{name}" for name in ADAPTED), needs={f"{C10D}.{n}": r for n, r in READS.items()},
       optional=(f"{C10D}.reduce_scatter_single",))  # new in 2.13; reduce_scatter_tensor calls it there
def _nccl_collectives() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    adapted = [name for name in ADAPTED if hasattr(c10d, name)]
    original = {name: getattr(c10d, name) for name in adapted + ["broadcast"]}
    for name in adapted:
        wrapped = _nccl_semantics(name, original)
        if getattr(dist, name, None) is original[name]:
            setattr(dist, name, wrapped)
        setattr(c10d, name, wrapped)


P2P = ("send", "recv", "isend", "irecv")


def _untagged(plain: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(plain)
    def p2p(*args: Any, **kwargs: Any) -> Any:
        call = arguments(plain, args, kwargs)
        if call.get("tag") and is_nccl(call.get("group")):
            call["tag"] = 0
            return plain(**call)
        return plain(*args, **kwargs)

    return p2p


@patch("nccl.p2p-tags", "NCCL ignores a send's or recv's tag (pytorch#94819, #125079): on an NCCL group they match "
       "in the order they are posted, whatever their tags", targets=tuple(f"{C10D}.{name}" for name in P2P),
       needs={f"{C10D}.{name}": ("tag", "group") for name in P2P})
def _nccl_p2p_tags() -> None:
    """A script whose send and recv tags disagree runs on GPUs (NCCL pairs them in order) and hangs on gloo, which
    pairs by tag: on a group asked for NCCL, gloo gets every tag as 0, so it pairs in order too. (P2POp, and so
    batch_isend_irecv, calls the isend/irecv it was given: dist's, these.)"""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in P2P:
        plain = getattr(c10d, name)
        wrapped = _untagged(plain)
        if getattr(dist, name, None) is plain:
            setattr(dist, name, wrapped)
        setattr(c10d, name, wrapped)


PATCHES = ("nccl.groups", "nccl.premul-sum", "nccl.ddp-devices", "nccl.collectives", "nccl.p2p-tags")


def forget_groups() -> None:
    _Groups.nccl_world, _Groups.gloo, _Groups.premul = False, set(), {}
