"""Where a simulated GPU's data goes: CPU memory, whoever asks for it and in whatever form.

Three layers, each for what the one below cannot see:
- Kernels for torch's CUDA dispatch key. Every allocation for a CUDA device reaches one of a few operators
  (empty, empty_strided, the index factories, ...) at the CUDA key; here they allocate in CPU memory instead.
  The dispatcher routes there whoever calls: user code, autograd's backward formulas, nn.init, optimizers,
  DTensor, checkpoint loading. Every other operator sees CPU tensors and runs its CPU kernel at full speed.
- The few Python entry points whose C++ binding resolves a device before dispatching (and so needs CUDA's device
  guard): Tensor.to / .cuda / .pin_memory / .type, Module.to's argument parser, storages' .cuda, and
  torch.load's CUDA restore. They map the device to the CPU, after checking the ordinal as CUDA would.
- A TorchFunctionMode for what only the Python arguments show: a bare ordinal (device=0, torch.device(0)), a
  bare "cuda" without an index for the data-taking factories, and pinned-memory requests.

Tensors report device cpu: a tensor that reports cuda cannot run backward on a CPU-only torch (autograd's device
guard for CUDA is absent). Moving a tensor between the CPU and a simulated GPU therefore does not copy it: both
are the same memory (.cuda() and .cpu() return the tensor itself when nothing else changes).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from ..patching import patch
from . import memory
from .state import initialize, is_gpu, ordinal

_LIBRARIES: list = []  # the torch.library registrations live as long as the rank


def _cpu(device: Any) -> Any:
    """A simulated GPU device argument, checked, as the CPU device it lives on; anything else unchanged."""
    import torch

    if device is None or not is_gpu(device):
        return device
    ordinal(device)
    initialize()
    return torch.device("cpu")


def _on_cpu_kernel(op: Any, device_index: int | None) -> Any:
    """A CUDA-key kernel for `op`: the same call with its device (and pinning) moved to the CPU."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            gpu, kwargs["device"] = kwargs["device"], _cpu(kwargs["device"])
            meta = args, dict(kwargs, device="meta")
        elif device_index is not None and len(args) > device_index:
            gpu = args[device_index]
            args = args[:device_index] + (_cpu(args[device_index]),) + args[device_index + 1:]
            meta = args[:device_index] + ("meta",) + args[device_index + 1:], kwargs
        else:
            return op(*args, **kwargs)
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        # CUDA refuses a request past the device's memory before it allocates: so does a simulated GPU, whose host
        # might not hold the request at all (the bytes come from the same call on the meta device)
        memory.check(_nbytes(op(*meta[0], **dict(meta[1], pin_memory=False) if "pin_memory" in meta[1] else
                                meta[1])), gpu, str(op))
        return op(*args, **kwargs)

    return kernel


def _nbytes(out: Any) -> int:
    import torch

    tensors = [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]
    return sum(t.untyped_storage().nbytes() for t in tensors)


def _cuda_allocators() -> list[tuple[str, Any]]:
    """The aten operators that take a device and have a kernel per backend (no composite one): every CUDA
    allocation ends in one of them. Found from the dispatcher, so a torch that adds one is covered."""
    import torch

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    composite = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
    found = []
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::") or not any(a.name == "device" for a in schema.arguments):
            continue
        name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        try:
            if not has(name, "CPU") or any(has(name, key) for key in composite):
                continue
        except RuntimeError:  # a schema the dispatcher does not know (an alias)
            continue
        found.append((name, schema))
    return found


def _register_kernels() -> None:
    import torch

    library = torch.library.Library("aten", "IMPL")
    _LIBRARIES.append(library)
    for name, schema in _cuda_allocators():
        packet = getattr(torch.ops.aten, schema.name.split("::", 1)[1])
        op = getattr(packet, schema.overload_name or "default")
        positional = [a for a in schema.arguments if not a.kwarg_only]
        index = next((i for i, a in enumerate(positional) if a.name == "device"), None)
        library.impl(name.split("::", 1)[1], _on_cpu_kernel(op, index), "CUDA")


def _gpu_asked(args: tuple, kwargs: dict) -> int | None:
    """The simulated GPU a Tensor.to call moves to (its device argument, or a tensor's that lives on one)."""
    import torch

    device = kwargs.get("device", args[0] if args else None)
    if isinstance(device, torch.Tensor):
        return memory.device_of(device)
    return ordinal(device) if device is not None and not isinstance(device, torch.dtype) and is_gpu(device) else None


def _map_to_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Tensor.to / Module.to arguments: a device (first positional, or device=) that is a simulated GPU -> cpu."""
    if args and is_gpu(args[0]):
        args = (_cpu(args[0]),) + args[1:]
    if kwargs.get("device") is not None:
        kwargs = dict(kwargs, device=_cpu(kwargs["device"]))
    return args, kwargs


def _host_target(args: tuple, kwargs: dict) -> bool:
    """Whether a Tensor.to call names the host as "cpu" (a string): a device-to-host copy. A torch.device("cpu")
    may be a simulated GPU tensor's own .device (x.to(y.device)), which keeps the data on its GPU."""
    device = kwargs.get("device", args[0] if args else None)
    return isinstance(device, str) and device == "cpu"


def _on_gpu(tensor: Any) -> bool:
    import torch

    return type(tensor) in (torch.Tensor, torch.nn.Parameter) and memory.device_of(tensor) is not None


def _to_host(original_to: Any, tensor: Any, *args: Any, **kwargs: Any) -> Any:
    """A simulated GPU tensor copied to the host, as on a GPU: new memory, not the GPU's (freeing the GPU tensor
    frees its bytes; writing the copy leaves the GPU tensor as it was)."""
    import torch

    host = torch.device("cpu")  # (a string would come back here through the ordinal mode's torch function)
    if args and isinstance(args[0], str):
        args = (host, *args[1:])
    else:
        kwargs = dict(kwargs, device=host)
    with memory.host_copies():
        return original_to(tensor, *args, **dict(kwargs, copy=True))


def _to_gpu(original_to: Any, tensor: Any, index: int, *args: Any, **kwargs: Any) -> Any:
    """A tensor moved to simulated GPU `index`: a host tensor is copied (the GPU's memory is its own, as a
    transfer's is: the host buffer can be written again, freed or counted apart); one already there is itself."""
    import torch

    host = type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.is_cpu and \
        memory.device_of(tensor) is None
    moved = original_to(tensor, *args, **(dict(kwargs, copy=True) if host else kwargs))
    return memory.track(moved, index)


def _patch_tensor_methods() -> None:
    import torch

    original_to, original_cpu = torch.Tensor.to, torch.Tensor.cpu

    @functools.wraps(original_to)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _host_target(args, kwargs) and _on_gpu(self):
            return _to_host(original_to, self, *args, **kwargs)
        gpu = _gpu_asked(args, kwargs)
        args, kwargs = _map_to_args(args, kwargs)
        if gpu is None:
            return original_to(self, *args, **kwargs)
        return _to_gpu(original_to, self, gpu, *args, **kwargs)

    def cuda(self: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        index = ordinal(device if device is not None else "cuda")
        return _to_gpu(original_to, self, index, torch.device("cpu"), non_blocking=non_blocking, **kwargs)

    @functools.wraps(original_cpu)
    def cpu(self: Any, memory_format: Any = torch.preserve_format) -> Any:
        if _on_gpu(self):
            return _to_host(original_to, self, "cpu", memory_format=memory_format)
        return original_cpu(self, memory_format=memory_format)

    original_type = torch.Tensor.type

    def type_(self: Any, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
            dtype = "torch." + dtype[len("torch.cuda."):]  # the legacy CUDA tensor types are the CPU's here
        if dtype is None:
            return original_type(self)
        return original_type(self, dtype, non_blocking, **kwargs)

    tensor: Any = torch.Tensor
    tensor.to = to
    tensor.cuda = cuda
    tensor.cpu = cpu
    tensor.type = type_
    _patch_pinning(tensor)

    def storage_cuda(self: Any, device: Any = None, non_blocking: bool = False) -> Any:
        return memory.track(self, ordinal(device if device is not None else "cuda"))

    for storage in (torch.UntypedStorage, torch.TypedStorage):
        setattr(storage, "cuda", storage_cuda)  # noqa: B010 -- mypy refuses assigning a method


_PINNED: dict[int, Any] = {}  # storage._cdata -> a weak reference that forgets it: host memory pinned for a GPU


def pinned(tensor: Any) -> Any:
    """Mark `tensor`'s storage as page-locked host memory (is_pinned() says so while it lives)."""
    storage = tensor.untyped_storage()
    key = storage._cdata
    _PINNED[key] = weakref.ref(storage, functools.partial(_unpinned, key))
    return tensor


def _unpinned(key: int, _: Any) -> None:
    _PINNED.pop(key, None)


def _patch_pinning(tensor: Any) -> None:
    """pin_memory() copies into page-locked memory (a host copy here, marked pinned) unless already pinned;
    is_pinned() answers for that mark. A CPU-only torch cannot page-lock memory, and nothing here needs it."""
    import torch

    original_is_pinned = tensor.is_pinned

    def is_pinned(self: Any, device: Any = None) -> bool:
        if self.is_cpu and type(self) in (torch.Tensor, torch.nn.Parameter):
            return self.untyped_storage()._cdata in _PINNED
        return original_is_pinned(self)

    def pin_memory(self: Any, device: Any = None) -> Any:
        if is_pinned(self):
            return self
        with memory.host_copies():
            return pinned(self.clone(memory_format=torch.contiguous_format))

    tensor.is_pinned = is_pinned
    tensor.pin_memory = pin_memory


def _patch_module_to() -> None:
    import torch

    nn_c: Any = torch._C._nn
    original = nn_c._parse_to

    def parse_to(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _map_to_args(args, kwargs)
        return original(*args, **kwargs)

    nn_c._parse_to = parse_to


def _patch_load() -> None:
    """torch.load(map_location="cuda:i" / {..: "cuda:i"} / callable / nothing, for a GPU-saved checkpoint): CUDA
    storages restore into CPU memory, after the ordinal check torch.load makes."""
    import torch
    import torch.serialization as serialization

    def restore(obj: Any, location: str) -> Any:
        if not location.startswith("cuda"):
            return None
        index = ordinal(torch.device(location))
        if getattr(obj, "_torch_load_uninitialized", False):
            return memory.track(torch.UntypedStorage(obj.nbytes()), index)
        return memory.track(obj, index)

    registry = serialization._package_registry
    for position, (priority, tagger, deserializer) in enumerate(registry):
        target = getattr(deserializer, "args", (None,))[0] if isinstance(deserializer, functools.partial) else None
        if target == "cuda" or getattr(deserializer, "__name__", "") == "_cuda_deserialize":
            registry[position] = (priority, tagger, restore)


def _ordinal_mode() -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    device_type = torch.device

    class Ordinals(TorchFunctionMode):
        """device=0 and torch.device(0) mean cuda:0 on a GPU host; device="cuda" the current GPU."""

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if func is device_type and len(args) == 1 and not kwargs and isinstance(args[0], int):
                return device_type("cuda", args[0])
            if kwargs:
                device = kwargs.get("device")
                if device is not None and is_gpu(device):
                    kwargs = dict(kwargs, device=device_type("cuda", ordinal(device)))
                if kwargs.get("pin_memory"):
                    return pinned(func(*args, **dict(kwargs, pin_memory=False)))
                return func(*args, **kwargs)
            return func(*args)

    return Ordinals()


@patch("simgpu.placement", "tensors for a simulated GPU placed in CPU memory, whoever allocates them",
       targets=("torch.Tensor.to", "torch.Tensor.cuda", "torch.Tensor.cpu", "torch.Tensor.type",
                "torch.Tensor.pin_memory", "torch.Tensor.is_pinned",
                "torch._C._nn._parse_to", "torch.serialization._package_registry", "torch.UntypedStorage.cuda",
                "torch.TypedStorage.cuda", "torch.overrides.TorchFunctionMode"))
def install() -> None:
    _register_kernels()
    _patch_tensor_methods()
    _patch_module_to()
    _patch_load()
    _ordinal_mode().__enter__()  # for the rest of this rank's life
