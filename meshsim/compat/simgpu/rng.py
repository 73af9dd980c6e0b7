"""The simulated GPUs' random number generators, as CUDA's: a (seed, offset) Philox state per device.

torch.cuda.manual_seed*, seed*, initial_seed and get/set_rng_state* read and write that state in CUDA's own
layout (16 bytes: the seed, then the offset), which is what DTensor's OffsetBasedRNGTracker manipulates. A DTensor
random operation on a simulated GPU mesh (nn.init on DTensor parameters, FSDP2's reset_parameters, dropout on
DTensors) draws from the stream that (seed, offset) names, and the tracker moves the offset on every rank alike:
ranks that hold the same shard get the same values, other shards get their own, and every rank's state stays in
step, as on GPUs. Other random operations on simulated GPU tensors draw from the CPU generator, exactly as the
same script does with its device edited to "cpu" (the simulated device's tensors are CPU tensors).
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Iterator
from typing import Any

from ..patching import patch
from .state import State, ordinal

DEFAULT_SEED = 67280421310721  # c10's default_rng_seed_val: every CUDA generator starts from it
_MASK = (1 << 64) - 1


class _Philox:
    """Per simulated device: [seed, offset]."""

    states: dict[int, list[int]] = {}

    @classmethod
    def of(cls, device: Any = None) -> list[int]:
        index = State.current if device is None or device == "cuda" else ordinal(device)
        return cls.states.setdefault(index, [DEFAULT_SEED, 0])


def _as_bytes(seed: int, offset: int) -> Any:
    import torch

    signed = [v - (1 << 64) if v >= 1 << 63 else v for v in (seed & _MASK, offset & _MASK)]
    return torch.tensor(signed, dtype=torch.int64).view(torch.uint8).clone()


def get_rng_state(device: Any = "cuda") -> Any:
    seed, offset = _Philox.of(device)
    return _as_bytes(seed, offset)


def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
    import torch

    state = new_state.detach().to("cpu").contiguous()
    if state.dtype != torch.uint8 or state.numel() != 16:
        raise RuntimeError(f"RNG state is wrong size: a CUDA generator's state is 16 bytes (seed, offset); got "
                           f"{state.numel()} elements of {state.dtype}")
    seed, offset = (int(v) for v in state.view(torch.int64).tolist())
    _Philox.of(device)[:] = [seed & _MASK, offset]


def manual_seed(seed: int) -> None:
    _Philox.of()[:] = [int(seed) & _MASK, 0]


def manual_seed_all(seed: int) -> None:
    for index in range(State.devices):
        _Philox.of(index)[:] = [int(seed) & _MASK, 0]


def set_rng_state_all(states: Any) -> None:
    for index, state in enumerate(states):
        set_rng_state(state, index)


def cuda_rng_functions() -> dict[str, Any]:
    return {
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed_all,
        "seed": lambda: manual_seed(random.getrandbits(63)),
        "seed_all": lambda: manual_seed_all(random.getrandbits(63)),
        "initial_seed": lambda: _Philox.of()[0],
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_rng_state_all": lambda: [get_rng_state(i) for i in range(State.devices)],
        "set_rng_state_all": set_rng_state_all,
        "_get_rng_state_offset": lambda device="cuda": _Philox.of(device)[1],
        "_set_rng_state_offset": lambda offset, device="cuda": _Philox.of(device).__setitem__(1, int(offset)),
    }


def stream_seed(seed: int, offset: int) -> int:
    """The CPU generator's seed that stands for Philox's stream at (seed, offset): distinct pairs, distinct seeds
    (up to hash collisions of a 64-bit mix), the same pair the same seed on every rank."""
    return ((seed * 0x9E3779B97F4A7C15) ^ (offset * 0xC2B2AE3D27D4EB4F + 0x165667B19E3779F9)) & ((1 << 63) - 1)


def _region(original: Any) -> Any:
    """OffsetBasedRNGTracker._distribute_region, drawing the region's random op from (seed, offset) as CUDA does;
    the CPU generator is left as it was."""
    import torch

    @contextlib.contextmanager
    @functools.wraps(original)
    def region(self: Any, spec: Any, generator: Any = None, *args: Any, **kwargs: Any) -> Iterator[None]:
        with original(self, spec, generator, *args, **kwargs):
            device = getattr(self, "_device", None)
            if generator is not None or getattr(device, "type", None) != "cuda" or not self.distribute_region_enabled:
                yield
                return
            seed, offset = _Philox.of(device)  # the tracker has just set this shard's starting offset
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(stream_seed(seed, offset))
                yield

    return region


@patch("simgpu.rng", "CUDA's (seed, offset) generators, which DTensor's random ops follow",
       targets=("torch.cuda.manual_seed", "torch.cuda.get_rng_state",
                "torch.distributed.tensor._random.OffsetBasedRNGTracker._distribute_region"),
       needs={"torch.distributed.tensor._random.OffsetBasedRNGTracker._distribute_region": ("spec", "generator")})
def install() -> None:
    import torch

    _Philox.states = {}
    for name, fn in cuda_rng_functions().items():
        setattr(torch.cuda, name, fn)
    try:
        from torch.distributed.tensor import _random
    except ImportError:  # a torch without DTensor's RNG tracker: nothing to simulate for it
        return
    tracker: Any = _random.OffsetBasedRNGTracker
    tracker._distribute_region = _region(tracker._distribute_region)
