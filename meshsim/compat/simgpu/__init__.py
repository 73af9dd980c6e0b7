"""Simulated GPUs: each simulated host shows D CUDA devices that live in CPU memory.

What a script sees on a rank of host h (D = LOCAL_WORLD_SIZE), and where each part lives:
- devices.py: torch.cuda and torch.accelerator answer for D GPUs (is_available, device_count, set_device with
  CUDA's "invalid device ordinal", the device-index contexts, properties); streams and events are synchronous;
- placement.py: data for a simulated GPU (device="cuda"/"cuda:i"/an ordinal, .cuda(), .to(i), Module.to(i),
  torch.load(map_location=...)) lives in CPU memory, whoever allocates it (torch's CUDA dispatch key);
- memory.py (allocator.py, gpus.py): each GPU has a card's capacity, counts the bytes of the tensors on it, answers
  torch.cuda's memory statistics as the caching allocator does, and raises CUDA's OutOfMemoryError past it;
- rng.py: CUDA's (seed, offset) generators, which DTensor's random ops follow as on GPUs;
- amp.py: autocast("cuda") is real mixed precision on the CPU;
- collectives.py: "nccl" groups are gloo groups that keep NCCL's contract; DDP's device ids are checked;
- parallel.py: FSDP2 and DTensor (attention) run as on a GPU cluster;
- attention.py: CUDA's attention kernels, computed with the CPU's, for context parallelism's ring attention.
Anything of torch.cuda meshsim does not simulate raises SimulatedGPUError naming the API: never a silent wrong
answer. Tensors report device cpu.
"""

from __future__ import annotations

from typing import Any

from .. import patching
from . import amp, attention, collectives, devices, memory, parallel, placement, rng  # noqa: F401 -- importing registers them
from .state import SimulatedGPUError, State

__all__ = ["SimulatedGPUError", "install", "PATCHES"]

# Installed in this order (the modules import torch only when a patch is installed).
PATCHES = ("simgpu.devices", "simgpu.rng", "simgpu.placement", "simgpu.memory", "simgpu.amp", *collectives.PATCHES,
           "simgpu.parallel", "simgpu.attention")


def install(gpus: int, gpu: Any = None) -> None:
    """Make this process a rank of a simulated host with `gpus` GPUs, each the card `gpu` names (meshsim.compat.
    simgpu.gpus: "h100-80gb", "a100-40gb", ..., a number of bytes; None: an H100 80GB). Call before the script."""
    State.devices = gpus
    State.current = 0
    State.initialized = False
    collectives.forget_groups()
    for name in PATCHES:
        patching.install(name, *((gpu,) if name == "simgpu.memory" else ()))
