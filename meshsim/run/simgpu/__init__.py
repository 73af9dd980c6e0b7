"""Simulated GPUs: each simulated host shows D CUDA devices that live in CPU memory.

What a script sees on a rank of host h (D = LOCAL_WORLD_SIZE), and where each part lives:
- devices.py: torch.cuda and torch.accelerator answer for D GPUs (is_available, device_count, set_device with
  CUDA's "invalid device ordinal", the device-index contexts, properties); streams and events are synchronous;
- placement.py: data for a simulated GPU (device="cuda"/"cuda:i"/an ordinal, .cuda(), .to(i), Module.to(i),
  torch.load(map_location=...)) lives in CPU memory, whoever allocates it (torch's CUDA dispatch key);
- rng.py: CUDA's (seed, offset) generators, which DTensor's random ops follow as on GPUs;
- amp.py: autocast("cuda") is real mixed precision on the CPU;
- collectives.py: "nccl" groups are gloo groups that keep NCCL's contract; DDP's device ids are checked;
- parallel.py: FSDP2 and DTensor (attention) run as on a GPU cluster.
Anything of torch.cuda meshsim does not simulate raises SimulatedGPUError naming the API: never a silent wrong
answer. Tensors report device cpu.
"""

from __future__ import annotations

from .state import SimulatedGPUError, State

__all__ = ["SimulatedGPUError", "install"]


def install(devices: int) -> None:
    """Make this process a rank of a simulated host with `devices` GPUs (call before the script runs)."""
    from . import amp, collectives, parallel, placement, rng
    from . import devices as device_api

    State.devices = devices
    State.current = 0
    State.initialized = False
    device_api.install()
    rng.install()
    placement.install()
    amp.install()
    collectives.install()
    parallel.install()
