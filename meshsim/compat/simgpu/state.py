"""What a rank's simulated GPUs are: how many this host has, which is current, and the words for refusing."""

from __future__ import annotations

from typing import Any


class SimulatedGPUError(RuntimeError):
    """A CUDA API meshsim does not simulate on its CPU-backed GPUs (named in the message)."""


class State:
    """This rank's simulated host: `devices` GPUs, `current` the one torch.cuda.set_device chose."""

    devices = 1
    current = 0
    initialized = False  # CUDA initializes lazily: on first use, not when asked how many devices there are


def initialize() -> None:
    State.initialized = True


def refusal(api: str, why: str = "") -> SimulatedGPUError:
    reason = why or f"meshsim simulates GPUs in CPU memory and does not simulate {api}"
    return SimulatedGPUError(f"{api}: {reason} (docs/launch.md's 'Simulated GPUs' lists what is simulated)")


def refused(api: str, why: str = "") -> Any:
    """A stand-in for `api` that raises SimulatedGPUError naming it, whatever it is called with."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise refusal(api, why)

    refuse.__name__ = refuse.__qualname__ = api.rsplit(".", 1)[-1]
    return refuse


def ordinal(device: Any) -> int:
    """The simulated GPU a device argument names: an int, "cuda", "cuda:i" or a torch.device; "cuda" alone is the
    current one. An ordinal this host lacks fails as CUDA fails ("invalid device ordinal")."""
    import torch

    if isinstance(device, int) and not isinstance(device, bool):
        index: int | None = device
    else:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        index = device.index
    if index is None:
        return State.current
    if not 0 <= index < State.devices:
        error = getattr(torch, "AcceleratorError", RuntimeError)  # what torch >= 2.8 raises for a CUDA error
        raise error(f"CUDA error: invalid device ordinal (device {index}; this simulated host has "
                    f"{State.devices} GPUs, 0..{State.devices - 1})")
    return index


def is_gpu(device: Any) -> bool:
    """Whether a device argument means a (simulated) GPU: a bare ordinal, "cuda..." or a cuda torch.device."""
    import torch

    if isinstance(device, int):
        return not isinstance(device, bool)
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"
