"""The machine a cluster's ranks run on, as far as the model and the generator need to know it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    """What the ranks' machine decides: the default device type of a mesh (the backend's), and whether a rank
    can set a CUDA device (DeviceMesh does so when a "cuda" mesh builds its groups)."""

    device: str = "cpu"
    cuda: bool = False


CPU = Platform()
