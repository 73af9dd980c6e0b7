"""A simulated GPU's memory: the bytes of the tensors that live on it, and torch.cuda's memory API over them.

Which storages live on a simulated GPU (they are all in CPU memory; this says which device they stand for):
- a factory asked for a GPU (device="cuda"/"cuda:i"/an ordinal, to_empty(device="cuda"), a default device of
  cuda), a tensor or module moved there (.cuda(), .to("cuda"), Module.to(i)), a storage torch.load restores for
  one;
- the output of any operator one of whose inputs lives on a GPU (autograd's formulas, optimizers' states, DTensor's
  local operators, the collectives' results), and whatever a non-copy operator writes into in place, like an
  out= buffer or a collective's output (FSDP's all-gather and reduce-scatter buffers);
- not: a copy_ into a CPU tensor (a device-to-host copy), a factory asked for the CPU.
A TorchDispatchMode sees every operator, whoever calls it (DTensor's own operators pass it down to their local
ones), and skips at once those that cannot allocate (views, copies); a weak reference to each storage frees its
bytes when torch frees it; UntypedStorage.resize_ (FSDP's free and re-allocation of unsharded parameters) is
followed. The bytes go through the caching allocator's books (allocator.py), which answer memory_stats() and the
rest, and raise CUDA's OutOfMemoryError past the capacity.

Tensors copied to the host (.cpu(), .to("cpu"), pin_memory()) are new host memory, as on a GPU; .to(x.device)
names the CPU that a simulated GPU tensor reports, and stays on its GPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from ..patching import patch, wrap
from .allocator import Allocator, OutOfMemory
from .gpus import GPU, gpu_of
from .state import State, initialize, is_gpu, ordinal


class Books:
    """This rank's simulated GPUs' memory: an allocator a device, and every storage counted, by its StorageImpl."""

    gpu: GPU = gpu_of(None)
    allocators: dict[int, Allocator] = {}
    storages: dict[int, tuple[int, int]] = {}  # storage._cdata -> (device, bytes)
    refs: dict[int, Any] = {}  # storage._cdata -> the weak reference that releases it
    mode: Any = None
    host = False  # inside host_copies(): what operators allocate is host memory


@contextlib.contextmanager
def host_copies() -> Iterator[None]:
    """What is allocated inside is host memory, whatever its inputs (a device-to-host copy: .cpu(), pinning)."""
    previous, Books.host = Books.host, True
    try:
        yield
    finally:
        Books.host = previous


def reset(gpu: GPU) -> None:
    Books.gpu, Books.allocators, Books.storages, Books.refs = gpu, {}, {}, {}


def allocator(device: int | None = None) -> Allocator:
    index = State.current if device is None else device
    books = Books.allocators.get(index)
    if books is None:
        books = Books.allocators[index] = Allocator(index, Books.gpu.total_memory)
    return books


def _device(device: Any) -> int:
    initialize()
    return State.current if device is None else ordinal(device)


# ------------------------------------------------------------------------------------------------ counting storages

def _count(storage: Any, device: int, where: Any = "") -> None:
    """Count `storage` on simulated GPU `device` (once: a storage already counted stays where it is). `where`: what
    allocates it (an operator), named only if it does not fit."""
    key = storage._cdata
    if key in Books.storages or storage.device.type != "cpu":
        return
    size = storage.nbytes()
    try:
        allocator(device).allocate(size)
    except OutOfMemory as exc:
        raise _oom(exc.message, device, str(where)) from None
    Books.storages[key] = (device, size)
    # a weak reference's callback, kept alive by the books, frees the bytes with the storage (weakref.finalize
    # costs twice as much, and a training step counts and frees a storage per operator it runs)
    Books.refs[key] = weakref.ref(storage, functools.partial(_released, key))


def check(size: int, device: Any, where: str = "") -> None:
    """Raise CUDA's OutOfMemoryError if `size` bytes would not fit on simulated GPU `device` (before allocating)."""
    index = _device(device)
    try:
        allocator(index).check(size)
    except OutOfMemory as exc:
        raise _oom(exc.message, index, where) from None


def _released(key: int, _: Any) -> None:
    _release(key)


def _release(key: int) -> None:
    Books.refs.pop(key, None)
    device, size = Books.storages.pop(key, (None, 0))
    if device is not None:
        allocator(device).free(size)


def _resized(storage: Any, where: Any = "") -> None:
    """A counted storage that changed size (resize_): its old bytes freed, its new ones allocated."""
    entry = Books.storages.get(storage._cdata)
    if entry is None:
        return
    device, old = entry
    new = storage.nbytes()
    if new == old:
        return
    books = allocator(device)
    books.free(old)
    Books.storages[storage._cdata] = (device, 0)
    try:
        books.allocate(new)
    except OutOfMemory as exc:
        raise _oom(exc.message, device, str(where)) from None
    Books.storages[storage._cdata] = (device, new)


def _oom(message: str, device: int, where: str) -> Exception:
    import torch

    rank = os.environ.get("RANK", "?")
    site = f"; in {where}" if where else ""
    return torch.OutOfMemoryError(f"{message} (meshsim: rank {rank}, simulated GPU {device}: "
                                  f"{Books.gpu.describe()}{site})")


def _plain() -> tuple[type, ...]:
    import torch

    return (torch.Tensor, torch.nn.Parameter)


_PLAIN: tuple[type, ...] = ()  # torch.Tensor and Parameter once torch is imported: nearly every operand is one


def _storages(tensor: Any) -> list[Any]:
    """The storages a tensor's data is in (a wrapper subclass's inner tensors'); none for meta or fake ones."""
    if type(tensor) in _PLAIN:  # no subclass to look into (first, and without imports: this runs for every operator)
        return [tensor.untyped_storage()] if tensor.is_cpu else []
    import torch
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if type(tensor) in _plain():
        return [tensor.untyped_storage()] if tensor.is_cpu else []
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        inner = [getattr(tensor, name) for name in names]  # (a subclass may name a non-tensor, as a mesh)
        return [s for value in inner if isinstance(value, torch.Tensor) for s in _storages(value)]
    if not tensor.is_cpu:
        return []
    return [tensor.untyped_storage()]


def track(tensor: Any, device: Any = None) -> Any:
    """A tensor (or module's tensors) now on simulated GPU `device` (an ordinal or device; None: current)."""
    import torch

    index = _device(device)
    if isinstance(tensor, torch.nn.Module):
        for value in list(tensor.parameters()) + list(tensor.buffers()):
            track(value, index)
            if value.grad is not None:
                track(value.grad, index)
    elif isinstance(tensor, torch.Tensor):
        for storage in _storages(tensor):
            _count(storage, index)
    elif isinstance(tensor, (torch.UntypedStorage, torch.TypedStorage)):
        _count(tensor._untyped_storage if isinstance(tensor, torch.TypedStorage) else tensor, index)
    return tensor


def device_of(tensor: Any) -> int | None:
    """The simulated GPU a tensor lives on, or None for host memory."""
    return _device_of([tensor])


def _tensors(values: Any) -> list[Any]:
    """The tensors among an operator's arguments or outputs (one level of lists, as aten's schemas have)."""
    import torch

    if isinstance(values, torch.Tensor):
        return [values]
    if isinstance(values, (list, tuple)):
        return [v for v in values if isinstance(v, torch.Tensor)]
    return []


def _device_of(tensors: list[Any]) -> int | None:
    for tensor in tensors:
        for storage in _storages(tensor):
            entry = Books.storages.get(storage._cdata)
            if entry is not None:
                return entry[0]
    return None


# What accounting does for an operator, read once from its schema (a training step runs the same few dozen
# operators over and over, and most of them cannot create a storage). _VIEW: it writes nothing and returns only
# aliases of its inputs, whose storages are counted already or host memory; _COPY: a copy_ or set_, which keeps
# its destination where it is. Neither has anything to count.
_VIEW = ((-1, "view"),)
_COPY = ((-1, "copy"),)
# operator -> None (it returns new tensors), _VIEW, _COPY, or the arguments it writes in place (position, name)
_OPS: dict[Any, tuple[tuple[int, str], ...] | None] = {}


def _op(func: Any) -> tuple[tuple[int, str], ...] | None:
    """What accounting does for `func` (see _OPS), found from its schema and remembered."""
    schema = getattr(func, "_schema", None)  # a higher-order operator has none: it returns new tensors
    found = None
    if schema is not None:
        written = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                        if a.alias_info is not None and a.alias_info.is_write)
        if written:
            found = _COPY if func.__name__ in _COPIES else written
        elif schema.returns and all(r.alias_info is not None for r in schema.returns):
            found = _VIEW
    _OPS[func] = found
    return found


def _storage_entries(values: Any) -> list[tuple[Any, tuple[int, int] | None]]:
    """(storage, its entry in the books or None) of every storage of the tensors among `values`."""
    books = Books.storages
    if type(values) in _PLAIN:  # the commonest: one plain tensor
        if not values.is_cpu:
            return []
        storage = values.untyped_storage()
        return [(storage, books.get(storage._cdata))]
    return [(storage, books.get(storage._cdata)) for t in _tensors(values) for storage in _storages(t)]


def _input_device(args: tuple, kwargs: dict) -> int | None:
    """The simulated GPU of an operator's first input that lives on one (plain tensors looked up directly: this
    runs for most operators that allocate)."""
    import torch

    storages = Books.storages
    for value in (*args, *kwargs.values()):
        for tensor in (value if isinstance(value, (list, tuple)) else (value,)):
            if type(tensor) in _PLAIN:
                if tensor.is_cpu:
                    entry = storages.get(tensor.untyped_storage()._cdata)
                    if entry is not None:
                        return entry[0]
            elif isinstance(tensor, torch.Tensor):
                found = _device_of([tensor])
                if found is not None:
                    return found
    return None


def account(func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """Count what an operator put on a simulated GPU: its outputs, and what it wrote into in place."""
    op = _OPS[func] if func in _OPS else _op(func)
    if op is _VIEW or op is _COPY or Books.host:
        return
    asked = kwargs.get("device")
    if asked is not None and not is_gpu(asked) and not (func.__name__ in _STAYS and str(asked) == "cpu"):
        return  # asked for the CPU (or meta): host memory
    if op is None:  # new outputs: those not counted yet need the inputs' device
        fresh = [storage for storage, entry in _storage_entries(out) if entry is None]
    else:  # in place: a written storage already counted at its size stays as it is (the usual add_, mul_.out)
        entries = [(storage, entry) for i, name in op
                   for storage, entry in _storage_entries(args[i] if i < len(args) else kwargs.get(name))]
        for storage, entry in entries:
            if entry is not None and entry[1] != storage.nbytes():
                _resized(storage, func)  # resize_, set_, a collective into a freed buffer
        fresh = [storage for storage, entry in entries if entry is None]
    if not fresh:
        return
    device = _device(asked) if asked is not None and is_gpu(asked) else _input_device(args, kwargs)
    if device is None:
        return
    for storage in fresh:
        _count(storage, device, func)


# A simulated GPU's tensor reports device cpu, so a copy that names its own device names the CPU: type_as (C++
# passes the other tensor's device), to(x.device, dtype). It stays on the tensor's GPU, as .cpu() does.
_STAYS = {"_to_copy.default"}
_COPIES = {"copy_.default", "copy_", "_copy_from.default", "set_.source_Storage", "set_.source_Storage_storage_offset",
           "set_.source_Tensor", "set_.default"}  # a copy_ keeps its destination where it is


def _mode() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    passed_down = _subclasses_that_dispatch_locally()

    class DeviceMemory(TorchDispatchMode):
        """Counts what every operator puts on a simulated GPU (see the module's docstring)."""

        # Higher-order operators (flex attention run eagerly) pass through here too: they run as torch runs them
        # without a mode (their dense CPU implementation), and what they return is counted, not their inner steps.
        supports_higher_order_operators = True

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch (2.11+) wraps a mode's __torch_dispatch__ in _disable_dynamo, which costs a training step
            # more than the counting does. Nothing compiles until torch.compile is called: _guard_from_dynamo
            # puts the wrapper on then (without it dynamo traces into this method and fails)
            return False

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if types and _passes_down(types, passed_down):
                return NotImplemented  # DTensor runs its local operators below this mode: they are counted there
            out = func(*args, **kwargs)
            if _OPS.get(func, True) is not _VIEW:  # (a view, the commonest operator, stops here)
                account(func, args, kwargs, out)
            return out

    return DeviceMemory()


def _guard_from_dynamo() -> None:
    """Wrap the memory mode's __torch_dispatch__ as torch would have (see DeviceMemory._should_skip_dynamo), once
    something is about to be compiled."""
    import torch

    mode_type = type(Books.mode)
    raw = mode_type.__dict__.get("__torch_dispatch__")
    if raw is None or getattr(mode_type, "_dynamo_guarded", False) or not hasattr(torch, "_disable_dynamo"):
        return
    mode_type.__torch_dispatch__ = torch._disable_dynamo(raw, recursive=True)
    mode_type._dynamo_guarded = True


_PASSED: dict[tuple, bool] = {}  # the argument types of an operator -> whether one of them is passed down


def _passes_down(types: Any, passed_down: tuple[type, ...]) -> bool:
    key = tuple(types)
    found = _PASSED.get(key)
    if found is None:
        found = _PASSED[key] = any(issubclass(t, passed_down) for t in key)
    return found


def _subclasses_that_dispatch_locally() -> tuple[type, ...]:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return ()
    return (DTensor,)


# ------------------------------------------------------------------------------------------------ torch.cuda's API

def memory_stats(device: Any = None) -> OrderedDict[str, int]:
    return allocator(_device(device)).memory_stats()


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def _stat(key: str) -> Any:
    def read(device: Any = None) -> int:
        return memory_stats(device)[key]

    read.__name__ = key.replace(".", "_")
    return read


def reset_peak_memory_stats(device: Any = None) -> None:
    allocator(_device(device)).reset_peaks()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    allocator(_device(device)).reset_accumulated()


def empty_cache() -> None:
    for books in Books.allocators.values():
        books.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes, as cudaMemGetInfo: the capacity less what the caching allocator reserved."""
    books = allocator(_device(device))
    return max(books.capacity - books.reserved, 0), books.capacity


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    if not isinstance(fraction, float) and not isinstance(fraction, int):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    allocator(_device(device)).fraction = float(fraction)


def get_per_process_memory_fraction(device: Any = None) -> float:
    return allocator(_device(device)).fraction


def cuda_memory_functions() -> dict[str, Any]:
    return {
        "memory_stats": memory_stats, "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
        "memory_allocated": _stat("allocated_bytes.all.current"),
        "max_memory_allocated": _stat("allocated_bytes.all.peak"),
        "memory_reserved": _stat("reserved_bytes.all.current"),
        "max_memory_reserved": _stat("reserved_bytes.all.peak"),
        "memory_cached": _stat("reserved_bytes.all.current"),
        "max_memory_cached": _stat("reserved_bytes.all.peak"),
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats,
        "reset_max_memory_cached": reset_peak_memory_stats,
        "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
        "empty_cache": empty_cache, "mem_get_info": mem_get_info,
        "set_per_process_memory_fraction": set_per_process_memory_fraction,
        "get_per_process_memory_fraction": get_per_process_memory_fraction,
        "get_allocator_backend": lambda: "native",
        "ipc_collect": lambda: None,  # no CUDA IPC memory is ever shared here: nothing to collect
    }


ACCELERATOR = {"memory_stats": "memory_stats", "memory_allocated": "memory_allocated",
               "max_memory_allocated": "max_memory_allocated", "memory_reserved": "memory_reserved",
               "max_memory_reserved": "max_memory_reserved", "reset_peak_memory_stats": "reset_peak_memory_stats",
               "reset_accumulated_memory_stats": "reset_accumulated_memory_stats", "empty_cache": "empty_cache",
               "get_memory_info": "mem_get_info"}


def _accelerator(fn: Any) -> Any:
    """torch.accelerator's form of a torch.cuda memory function: the device index, if it takes a device at all
    (empty_cache takes none)."""
    if fn is empty_cache:
        return lambda: empty_cache()
    return lambda device_index=None, /: fn(device_index)


def _follow_resize() -> None:
    import torch

    def resize(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _resized(self, "UntypedStorage.resize_")
        return result

    wrap(torch.UntypedStorage, "resize_", resize)


def _follow_module_to() -> None:
    import torch

    def to(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        device = kwargs.get("device", args[0] if args else None)
        if device is not None and not isinstance(device, (torch.dtype, torch.Tensor)) and is_gpu(device):
            track(result, device)
        return result

    wrap(torch.nn.Module, "to", to)


def _say_compile_runs_eagerly() -> None:
    """torch.compile skips every frame while a TorchDispatchMode is on the stack, and the one that counts the
    simulated GPUs' memory is on for the rank's life: compiled code runs as eager PyTorch, with no error. A user
    testing compiled code is told so, once (by rank 0), rather than left to believe it compiled."""
    import sys

    import torch

    told: list[bool] = []

    def compile(original: Any, *args: Any, **kwargs: Any) -> Any:
        _guard_from_dynamo()
        if not told and os.environ.get("RANK", "0") == "0":
            told.append(True)
            print("meshsim: torch.compile runs eagerly here: the dispatch mode that counts the simulated GPUs' "
                  "memory makes torch skip every frame it would compile (the results and the collectives are eager "
                  "PyTorch's); compiled code is tested on real GPUs", file=sys.stderr, flush=True)
        return original(*args, **kwargs)

    def guarded(original: Any, *args: Any, **kwargs: Any) -> Any:
        _guard_from_dynamo()
        return original(*args, **kwargs)

    wrap(torch, "compile", compile)
    dynamo = sys.modules.get("torch._dynamo")  # (imported already in a rank; importing it here costs 0.4-0.7 s)
    for name in ("optimize", "export") if dynamo else ():  # dynamo's other doors
        if hasattr(dynamo, name):
            wrap(dynamo, name, guarded)


MEMORY_TARGETS = ("torch.cuda.memory.memory_stats", "torch.cuda.memory.memory_summary", "torch.cuda.mem_get_info",
                  "torch.cuda.memory.is_initialized", "torch.UntypedStorage.resize_", "torch.nn.Module.to",
                  "torch.utils._python_dispatch.TorchDispatchMode", "torch.OutOfMemoryError", "torch.compile")


@patch("simgpu.memory", "a simulated GPU's memory: the bytes of the tensors on it, torch.cuda's memory statistics, "
       "its capacity and CUDA's out-of-memory error",
       targets=MEMORY_TARGETS + tuple(f"torch.accelerator.{name}" for name in ACCELERATOR),
       optional=tuple(f"torch.accelerator.{name}" for name in ACCELERATOR))
def install(gpu: Any = None) -> None:
    import torch
    import torch.cuda.memory

    reset(gpu_of(gpu))
    functions = cuda_memory_functions()
    cuda_memory: Any = torch.cuda.memory
    for name, fn in functions.items():
        setattr(torch.cuda, name, fn)
        setattr(cuda_memory, name, fn)
    cuda_memory.is_initialized = lambda: State.initialized  # memory_summary asks it, as imported there
    for module in [torch.accelerator] + ([torch.accelerator.memory] if hasattr(torch.accelerator, "memory") else []):
        for name, ours in ACCELERATOR.items():
            if hasattr(module, name):
                setattr(module, name, _accelerator(functions[ours]))
    _follow_resize()
    _follow_module_to()
    _say_compile_runs_eagerly()
    global _PLAIN
    _PLAIN = _plain()
    if Books.mode is None:
        Books.mode = _mode()
        Books.mode.__enter__()  # for the rest of this rank's life
