"""The machine a cluster's ranks run on, as far as the model and the generator need to know it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.releases import Release, cuda_build, installed


@dataclass(frozen=True)
class Platform:
    """What the ranks' machine decides: the default device type of a mesh (the backend's), whether a rank can
    set a CUDA device (DeviceMesh does so when a "cuda" mesh builds its groups), and the torch the ranks run: its
    release (the model follows its semantics, meshsim.model.semantics) and whether it is a CUDA build (which
    refuses a missing GPU in its own words)."""

    device: str = "cpu"
    cuda: bool = False
    release: Release = field(default_factory=installed)
    cuda_build: bool = field(default_factory=cuda_build)
    # rules of meshsim.model.semantics held (or not) whatever the release: how a rule's releases are measured
    forced: tuple[tuple[str, bool], ...] = ()


CPU = Platform()


BACKENDS = ("gloo", "nccl", "cpu:gloo,cuda:nccl", "auto")  # what --backend and Cluster(backend=) take


def uses_nccl(backend: str) -> bool:
    """Whether ranks of this (resolved) backend run on GPUs: "nccl", or a device map that gives cuda to nccl."""
    return "nccl" in backend


def platform_for(backend: str) -> Platform:
    """The platform of ranks on this resolved backend: NCCL ranks have a GPU each, and default to cuda meshes."""
    return Platform("cuda", True) if uses_nccl(backend) else CPU
