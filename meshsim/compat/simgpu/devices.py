"""torch.cuda and torch.accelerator as a host of D GPUs that live in CPU memory.

Device queries answer for the simulated host; streams and events are synchronous (a CPU operation has finished
when it returns, so every wait is already satisfied); annotations for profilers (NVTX) do nothing, as they do
with no profiler attached; memory is memory.py's. Every other public function of torch.cuda (CUDA graphs, NCCL's
communicators, raw allocations, NVML, the allocator's history) raises SimulatedGPUError naming it: there is no
honest answer on the CPU.
"""

from __future__ import annotations

import itertools
import os
import time
import types
from typing import Any

from ..patching import patch
from . import memory
from .state import State, initialize, is_gpu, ordinal, refused


def _current_index(device: Any = None) -> int:
    initialize()
    return State.current if device is None else ordinal(device)


def _initializing(fn: Any) -> Any:
    """A torch.cuda function that, as on a GPU, initializes CUDA when first called."""

    def call(*args: Any, **kwargs: Any) -> Any:
        initialize()
        return fn(*args, **kwargs)

    call.__name__ = getattr(fn, "__name__", "call")
    return call


class Stream:
    """A synchronous stream: work queued on it has finished by the time it is queued. Each stream is its own (a new
    one is not the default stream); the current stream is the one a stream context or set_stream chose."""

    _made = itertools.count(1)

    def __init__(self, device: Any = None, priority: int = 0, *, default: bool = False, **kwargs: Any):
        import torch

        self.device = torch.device("cuda", _current_index(device))
        self.priority = priority
        self.stream_id = 0 if default else next(Stream._made)
        self.cuda_stream = self.stream_id  # the default stream's handle is 0, as CUDA's legacy default stream
        self.device_type = "cuda"
        self.device_index = self.device.index

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False  # no CUDA graph is ever being captured here: graphs are refused

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and (other.device, other.stream_id) == (self.device, self.stream_id)

    def __hash__(self) -> int:
        return hash(("meshsim-stream", self.device.index, self.stream_id))

    def __enter__(self) -> Stream:
        self._context = StreamContext(self)
        self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)

    def __repr__(self) -> str:
        return f"<simulated cuda stream {self.stream_id} on {self.device}, synchronous>"


_CURRENT_STREAMS: dict[int, Stream] = {}  # device -> the stream set current on it (absent: the default stream)


def current_stream(device: Any = None) -> Stream:
    index = _current_index(device)
    return _CURRENT_STREAMS.get(index) or Stream(index, default=True)


def set_stream(stream: Any) -> None:
    if stream is not None:
        _CURRENT_STREAMS[stream.device.index] = stream


class Event:
    """A synchronous event: recorded means reached. Its time is the host's clock when it was recorded (the work
    queued before it has run by then), so elapsed_time is the wall time of the CPU's work between two events."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 device: Any = None, **_: Any):
        import torch

        self.enable_timing = enable_timing
        self.recorded = False
        self.time = 0.0
        self.device = None if device is None else torch.device("cuda", _current_index(device))

    def record(self, stream: Any = None) -> None:
        self.recorded = True
        self.time = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds between this event and end_event, with CUDA's errors for events that cannot be timed."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if not (self.recorded and end_event.recorded):
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event.time - self.time) * 1000.0


class DeviceContext:
    """torch.cuda.device(i) / torch.accelerator.device_index(i): i is current inside, the previous one after."""

    def __init__(self, device: Any, /):
        self.index = None if device is None or (isinstance(device, int) and device < 0) else ordinal(device)
        self.previous = State.current

    def __enter__(self) -> None:
        self.previous = State.current
        if self.index is not None:
            State.current = self.index

    def __exit__(self, *exc: Any) -> None:
        State.current = self.previous


class StreamContext:
    """torch.cuda.stream(s): s is its device's current stream inside, the previous one after (None: no change)."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.previous: Stream | None = None

    def __enter__(self) -> Any:
        if self.stream is not None:
            self.previous = _CURRENT_STREAMS.get(self.stream.device.index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.stream is None:
            return
        if self.previous is None:
            _CURRENT_STREAMS.pop(self.stream.device.index, None)
        else:
            set_stream(self.previous)


class DeviceProperties(types.SimpleNamespace):
    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count})")


def properties(device: Any = None) -> DeviceProperties:
    """What a simulated GPU reports: the card it simulates (`--gpu`; an H100 80GB unless told), its memory the
    capacity its allocator holds to (memory.py)."""
    index = _current_index(device)
    gpu = memory.Books.gpu
    return DeviceProperties(name=gpu.name, major=gpu.capability[0], minor=gpu.capability[1],
                            total_memory=gpu.total_memory, multi_processor_count=gpu.multiprocessors,
                            is_integrated=False, is_multi_gpu_board=False, warp_size=32, L2_cache_size=gpu.l2_cache,
                            uuid=f"meshsim-{index}", pci_bus_id=index, pci_device_id=0, pci_domain_id=0)


def set_device(device: Any) -> None:
    if isinstance(device, int) and device < 0:
        return  # torch.cuda.set_device(-1) is a no-op
    State.current = ordinal(device)
    initialize()


def cuda_functions() -> dict[str, Any]:
    """torch.cuda's device, stream and event API for the simulated host (its RNG is in rng.py)."""
    return {
        "is_available": lambda: True,
        "is_initialized": lambda: State.initialized,
        "init": initialize,
        "_lazy_init": initialize,
        "_is_in_bad_fork": lambda: False,
        "device_count": lambda: State.devices,
        "set_device": set_device,
        "current_device": _initializing(lambda: State.current),
        "synchronize": _initializing(lambda device=None: None),
        "get_device_name": lambda device=None: properties(device).name,
        "get_device_properties": properties,
        "get_device_capability": lambda device=None: (_current_index(device), memory.Books.gpu.capability)[1],
        "get_arch_list": lambda: ["sm_{}{}".format(*memory.Books.gpu.capability)],
        "is_bf16_supported": lambda including_emulation=True: True,
        "is_tf32_supported": lambda: True,
        "Stream": Stream,
        "Event": Event,
        "StreamContext": StreamContext,
        "stream": lambda stream=None: StreamContext(stream),
        "current_stream": current_stream,
        "default_stream": lambda device=None: Stream(device, default=True),
        "set_stream": set_stream,
        "device": DeviceContext,
        "_DeviceGuard": DeviceContext,
        "device_of": lambda obj: DeviceContext(memory.device_of(obj) if hasattr(obj, "untyped_storage") else None),
        "is_current_stream_capturing": lambda: False,
    }


def accelerator_functions() -> dict[str, Any]:
    import torch

    cuda = torch.device("cuda")

    def set_index(device: Any) -> None:
        State.current = ordinal(device)
        initialize()

    return {
        "is_available": lambda: True,
        "device_count": lambda: State.devices,
        "current_accelerator": lambda check_available=False: cuda,
        "current_device_index": lambda: State.current,
        "current_device_idx": lambda: State.current,
        "set_device_index": set_index,
        "set_device_idx": set_index,
        "device_index": DeviceContext,
        "synchronize": lambda device=None: None,
        "current_stream": current_stream,
        "set_stream": set_stream,
        "get_device_capability": lambda device=None: dict(zip(("major", "minor"), memory.Books.gpu.capability)),
    }


def nvtx_functions() -> dict[str, Any]:
    """NVTX marks ranges for a profiler; with none attached they do nothing, and here none can be."""
    import contextlib

    depth = [0]

    def push(msg: Any = None, *args: Any, **kwargs: Any) -> int:
        depth[0] += 1
        return depth[0] - 1

    def pop() -> int:
        depth[0] = max(depth[0] - 1, 0)
        return depth[0]

    return {"range_push": push, "range_pop": pop, "mark": lambda *a, **k: None,
            "range_start": lambda *a, **k: 0, "range_end": lambda *a, **k: None,
            "range": lambda *a, **k: contextlib.nullcontext()}


def _accelerator_class(original: Any, simulated: Any, name: str) -> Any:
    """torch.Stream / torch.Event: for a CUDA device (or none: the current accelerator, CUDA here) the simulated
    class, for another device torch's own; isinstance holds for both."""

    class Generic(type):
        def __call__(cls, device: Any = None, *args: Any, **kwargs: Any) -> Any:
            if device is None or is_gpu(device):
                return simulated(*args, device=device, **kwargs)
            return original(device, *args, **kwargs)

        def __instancecheck__(cls, instance: Any) -> bool:
            return isinstance(instance, (original, simulated))

        def __subclasscheck__(cls, subclass: Any) -> bool:
            return issubclass(subclass, (original, simulated))

    return Generic(name, (), {"__module__": "torch", "__doc__": original.__doc__, "meshsim_original": original})


def _refuse_the_rest(module: Any, prefix: str, simulated: set[str]) -> None:
    """Every other public function or class of `module` (defined in torch.cuda) raises, naming itself."""
    for name in dir(module):
        value = getattr(module, name, None)
        if name.startswith("_") or name in simulated or not callable(value) or isinstance(value, types.ModuleType):
            continue
        if isinstance(value, type) and issubclass(value, BaseException):
            continue  # `except torch.cuda.OutOfMemoryError:` must keep working
        owner = getattr(value, "__module__", "") or ""
        if owner.startswith("torch.cuda") and not owner.startswith("torch.cuda.amp"):
            setattr(module, name, refused(f"{prefix}.{name}"))


@patch("simgpu.devices", "torch.cuda and torch.accelerator answering for the simulated host's GPUs",
       targets=("torch.cuda.device_count", "torch.cuda.set_device", "torch.cuda.get_device_properties",
                "torch.cuda.graphs.is_current_stream_capturing", "torch.cuda.nccl.version",
                "torch.cuda.nvtx.range_push",
                "torch._C._get_accelerator", "torch.accelerator.device_count", "torch.Tensor.record_stream",
                "torch.Stream", "torch.Event"))
def install() -> None:
    import torch
    import torch.cuda.nccl

    functions = cuda_functions()
    for name, fn in functions.items():
        setattr(torch.cuda, name, fn)
    graphs: Any = torch.cuda.graphs
    graphs.is_current_stream_capturing = functions["is_current_stream_capturing"]
    for name in _LEGACY_TYPES:  # torch.cuda.FloatTensor, ...: the CPU's, since that is where the data lives
        if hasattr(torch, name):
            setattr(torch.cuda, name, getattr(torch, name))
    simulated_memory = set(memory.cuda_memory_functions()) | {"memory_summary"}  # memory.py installs them
    _refuse_the_rest(torch.cuda, "torch.cuda", set(functions) | _RNG_NAMES | set(_LEGACY_TYPES) | simulated_memory)
    _refuse_the_rest(torch.cuda.memory, "torch.cuda.memory", simulated_memory)
    _refuse_the_rest(graphs, "torch.cuda.graphs", {"is_current_stream_capturing"})
    for name in _ALLOCATOR_HISTORY:  # private, but memory profilers call them: refused by name, not AttributeError
        for module, prefix in ((torch.cuda.memory, "torch.cuda.memory"), (torch.cuda, "torch.cuda")):
            if hasattr(module, name):
                setattr(module, name, refused(f"{prefix}.{name}", HISTORY_WHY))
    # the allocator's settings (expandable_segments, ...) change how CUDA fragments: the books' pool never does
    cuda_memory: Any = torch.cuda.memory
    cuda_memory._set_allocator_settings = lambda settings: None
    for name in ("CUDAGraph", "graph", "make_graphed_callables", "graph_pool_handle"):
        for module, prefix in ((torch.cuda, "torch.cuda"), (graphs, "torch.cuda.graphs")):
            if hasattr(module, name):
                setattr(module, name, refused(f"{prefix}.{name}", GRAPHS_WHY))
    nvtx: Any = torch.cuda.nvtx
    for name, fn in nvtx_functions().items():
        setattr(nvtx, name, fn)
    nccl_why = "meshsim runs NCCL's collectives on gloo (with NCCL's semantics); there is no NCCL library to call"
    for name in ("unique_id", "init_rank", "all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter"):
        setattr(torch.cuda.nccl, name, refused(f"torch.cuda.nccl.{name}", nccl_why))
    nccl: Any = torch.cuda.nccl
    nccl.version = lambda: NCCL_VERSION
    nccl.is_available = lambda tensors: all(t.is_contiguous() and not t.is_sparse for t in tensors)
    torch_c: Any = torch._C
    torch_c._nccl_version = lambda: NCCL_VERSION[0] * 10000 + NCCL_VERSION[1] * 100 + NCCL_VERSION[2]
    torch_c._get_accelerator = lambda check=False: torch.device("cuda")
    accel: Any = torch.accelerator
    simulated = accelerator_functions()
    for name, fn in simulated.items():
        setattr(accel, name, fn)
    for name in dir(accel):
        value = getattr(accel, name)
        if not name.startswith("_") and name not in simulated and name not in memory.ACCELERATOR and callable(value) \
                and not isinstance(value, type):
            if getattr(value, "__module__", "").startswith("torch.accelerator"):
                setattr(accel, name, refused(f"torch.accelerator.{name}"))
    torch_module: Any = torch
    if not hasattr(torch.Stream, "meshsim_original"):  # (once: a forked worker keeps its parent's)
        torch_module.Stream = _accelerator_class(torch.Stream, Stream, "Stream")
        torch_module.Event = _accelerator_class(torch.Event, Event, "Event")
    torch.Tensor.record_stream = lambda self, stream: None  # type: ignore[method-assign,assignment]
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(State.devices)))


# What torch.cuda.nccl.version() says: a recent NCCL's release, for scripts that gate a feature on it (every NCCL
# feature meshsim's "nccl" groups keep is there whatever the number); it is no library's, since none is loaded.
NCCL_VERSION = (2, 27, 5)

# The caching allocator's history and snapshots (torch.cuda.memory._record_memory_history, _snapshot, ...): the
# books count bytes per device, not blocks at addresses with the stack that allocated each.
_ALLOCATOR_HISTORY = ("_record_memory_history", "_record_memory_history_impl", "_record_memory_history_legacy",
                      "_snapshot", "_dump_snapshot", "_save_segment_usage", "_save_memory_usage", "_segments",
                      "_get_current_allocator", "_set_memory_metadata",
                      "_get_memory_metadata")
HISTORY_WHY = ("a simulated GPU counts bytes per device, not blocks with their addresses and stacks: there is no "
               "allocator history; memory_stats() and memory_summary() are simulated")

GRAPHS_WHY = ("a simulated GPU cannot capture a CUDA graph (no GPU runs its kernels to record them); turn capture "
              "off: torchtitan's --training.disable_cuda_graphs, torch.compile(mode='default') instead of "
              "'reduce-overhead'")

# torch.cuda's RNG functions are simulated in rng.py; install() leaves them for it
_RNG_NAMES = {"manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
              "set_rng_state", "get_rng_state_all", "set_rng_state_all"}

_LEGACY_TYPES = tuple(f"{kind}{suffix}" for kind in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short",
                                                     "Char", "Byte", "Bool", "ComplexFloat", "ComplexDouble")
                      for suffix in ("Tensor", "Storage"))
