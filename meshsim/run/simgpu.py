"""Simulated GPUs: each simulated host shows D CUDA devices that live in CPU memory.

What a script sees on a rank of host h (D = LOCAL_WORLD_SIZE):
- torch.cuda.is_available() is True, device_count() is D, set_device(i) works for 0 <= i < D and otherwise raises
  as CUDA does ("invalid device ordinal"), current_device() answers, synchronize() returns;
- torch.accelerator's device functions agree with torch.cuda;
- device="cuda" / "cuda:i" / torch.device("cuda", i), .cuda(), .to("cuda"), module.to("cuda") / .cuda() place
  data in CPU memory (a TorchFunctionMode);
- streams and events are synchronous (every CPU operation has completed when it returns);
- the "nccl" backend, and the "cuda" entry of the device -> backend map, become gloo;
- DDP's device_ids / output_device are dropped (DDP takes them only for modules on real GPUs).

Anything else of torch.cuda (CUDA graphs, memory statistics, custom kernels, ...) raises SimulatedGPUError naming
the API: never a silent wrong answer.
"""

from __future__ import annotations

import functools
import os
from typing import Any

REFUSED = ("graph", "CUDAGraph", "graphs", "make_graphed_callables", "memory_allocated", "max_memory_allocated",
           "memory_reserved", "max_memory_reserved", "memory_stats", "memory_summary", "mem_get_info",
           "reset_peak_memory_stats", "caching_allocator_alloc", "nvtx", "jiterator", "_sleep", "ipc_collect",
           "set_per_process_memory_fraction", "utilization", "temperature", "power_draw", "clock_rate")


class SimulatedGPUError(RuntimeError):
    """A CUDA API meshsim does not simulate on its CPU-backed GPUs."""


class _State:
    devices = 1
    current = 0


def _check(index: int) -> int:
    if not 0 <= index < _State.devices:
        raise RuntimeError(f"CUDA error: invalid device ordinal (device {index}; this simulated host has "
                           f"{_State.devices} GPUs, 0..{_State.devices - 1})")
    return index


def _index(device: Any) -> int:
    import torch

    if device is None:
        return _State.current
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"expected a cuda device, got {device}")
    return _State.current if device.index is None else device.index


class _Stream:
    """A synchronous stream: work on it has finished by the time it is queued."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        self.device = device
        self.priority = priority

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else _Event()

    def query(self) -> bool:
        return True

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class _Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        raise SimulatedGPUError("torch.cuda.Event.elapsed_time: meshsim's GPUs are simulated on the CPU and have "
                                "no timing")


class _DeviceContext:
    def __init__(self, device: Any):
        self.index = _index(device) if device is not None else None
        self.previous = _State.current

    def __enter__(self) -> None:
        if self.index is not None:
            _State.current = _check(self.index)

    def __exit__(self, *exc: Any) -> None:
        _State.current = self.previous


def _properties(device: Any = None) -> Any:
    from types import SimpleNamespace

    _check(_index(device))
    return SimpleNamespace(name="meshsim simulated GPU (CPU memory)", major=9, minor=0, total_memory=0,
                           multi_processor_count=1, is_integrated=False)


def _refuse(name: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise SimulatedGPUError(f"torch.cuda.{name}: meshsim simulates GPUs in CPU memory and does not simulate "
                                f"{name} (see the README's list of what is simulated)")

    return refused


def _cuda_functions() -> dict[str, Any]:
    import torch

    def set_device(device: Any) -> None:
        _State.current = _check(_index(device))

    return {
        "is_available": lambda: True,
        "device_count": lambda: _State.devices,
        "set_device": set_device,
        "current_device": lambda: _State.current,
        "synchronize": lambda device=None: None,
        "get_device_name": lambda device=None: _properties(device).name,
        "get_device_properties": _properties,
        "get_device_capability": lambda device=None: (9, 0),
        "Stream": _Stream,
        "Event": _Event,
        "StreamContext": lambda stream: stream if stream is not None else _Stream(),
        "stream": lambda stream=None: stream if stream is not None else _Stream(),
        "current_stream": lambda device=None: _Stream(device),
        "default_stream": lambda device=None: _Stream(device),
        "device": _DeviceContext,
        "is_initialized": lambda: True,
        "init": lambda: None,
        "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
        "seed": lambda: None,
        "seed_all": lambda: None,
        "initial_seed": lambda: torch.initial_seed(),
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": lambda state, device="cuda": None,
        "get_rng_state_all": lambda: [torch.get_rng_state() for _ in range(_State.devices)],
        "set_rng_state_all": lambda states: None,
        "empty_cache": lambda: None,
        "is_bf16_supported": lambda including_emulation=True: True,
        "get_arch_list": lambda: ["sm_90"],
    }


def _on_cpu(device: Any) -> Any:
    """cuda devices (and bare ordinals, which mean cuda) become the CPU; anything else is left alone."""
    import torch

    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _placement_mode() -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    to_cpu_methods = {torch.Tensor.cuda}

    class CudaOnCpu(TorchFunctionMode):
        """device="cuda" anywhere, .cuda(), .to("cuda"): the data stays in (simulated GPU =) CPU memory."""

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = dict(kwargs or {})
            if func in to_cpu_methods or getattr(func, "__name__", "") == "cuda":
                return args[0]
            if func is torch.device and args and (isinstance(args[0], int) or _on_cpu(args[0]) != args[0]):
                return torch.device("cpu")  # torch.device(0) / ("cuda", i): the simulated GPU is CPU memory
            if "device" in kwargs:
                kwargs["device"] = _on_cpu(kwargs["device"])
            if getattr(func, "__name__", "") == "to" and args:
                args = (args[0],) + tuple(_on_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args[1:])
            return func(*args, **kwargs)

    return CudaOnCpu()


def install(devices: int) -> None:
    """Make this process a rank of a simulated host with `devices` GPUs (call before the script runs)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    _State.devices = devices
    _State.current = 0
    for name, fn in _cuda_functions().items():
        setattr(torch.cuda, name, fn)
    for name in REFUSED:
        if hasattr(torch.cuda, name):
            setattr(torch.cuda, name, _refuse(name))
    cuda = torch.device("cuda")
    accel: Any = torch.accelerator  # its functions are replaced for the simulated devices
    torch_c: Any = torch._C
    torch_c._get_accelerator = lambda: cuda
    accel.is_available = lambda: True
    accel.device_count = lambda: _State.devices
    accel.current_accelerator = lambda check_available=False: cuda
    for name in ("current_device_index", "current_device_idx"):
        setattr(accel, name, lambda: _State.current)
    for name in ("set_device_index", "set_device_idx"):
        setattr(accel, name, lambda device: setattr(_State, "current", _check(_index(device))))
    accel.synchronize = lambda device=None: None
    accel.current_stream = lambda device=None: _Stream(device)
    dist.Backend.default_device_backend_map["cuda"] = "gloo"
    _gloo_for_nccl(dist, c10d)
    _ddp_on_simulated_gpus()
    _placement_mode().__enter__()  # for the rest of this rank's life
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(devices)))


def _ddp_on_simulated_gpus() -> None:
    """DDP(module, device_ids=[i], output_device=i) as GPU scripts write it: the module lives in CPU memory
    here, and DDP takes device ids only for modules on GPUs, so they are dropped."""
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__

    @functools.wraps(original)
    def init(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, *args: Any,
             **kwargs: Any) -> None:
        original(self, module, None, None, *args, **kwargs)

    setattr(DistributedDataParallel, "__init__", init)  # noqa: B010 -- mypy refuses assigning a method


def _gloo_for_nccl(dist: Any, c10d: Any) -> None:
    """init_process_group("nccl") and new_group(backend="nccl") get gloo: the simulated GPUs are CPU memory."""

    def translate(backend: Any) -> Any:
        if backend is None or backend == "undefined":
            return "gloo"  # torch would pick cuda:nccl for the (simulated) GPUs and leave the CPU without one
        if isinstance(backend, str) and "nccl" in backend.lower():
            return "gloo"  # gloo serves both cpu and cuda tensors, which live in CPU memory here
        return backend

    original_init = c10d.init_process_group

    @functools.wraps(original_init)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if "device_id" in kwargs:
            kwargs["device_id"] = None  # binding the group to a (simulated) GPU is for NCCL only
        return original_init(translate(backend), *args, **kwargs)

    original_new = c10d.new_group

    @functools.wraps(original_new)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = translate(kwargs["backend"])
        return original_new(*args, **kwargs)

    c10d.init_process_group = dist.init_process_group = init_process_group
    c10d.new_group = dist.new_group = new_group
    import torch.distributed.device_mesh as device_mesh

    if hasattr(device_mesh, "init_process_group"):  # DeviceMesh creates the default group itself when asked
        device_mesh.init_process_group = init_process_group
