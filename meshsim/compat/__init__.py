"""The one place meshsim touches torch: every patch it makes, and every torch function that differs by release.

- patching.py: the registry. Each patch names what it replaces, the releases it was written for, the parameters
  its wrappers read; `problems` says why one does not fit the installed torch, in one line;
- progress.py and follow.py: where a rank is, and the followers that make every collective, wait and group
  creation announce itself before it can block;
- simgpu/: simulated GPUs (devices, placement, RNG, autocast, FSDP and DTensor on them) and NCCL's contract
  over gloo (simgpu/collectives.py);
- tiers.py: what a tier's transport needs (the fake tier's group creation, the threaded group's reduce ops);
- api.py: what meshsim calls in torch that a release may lack or spell otherwise.

A patch that does not fit is found before any rank runs user code (`check`), as one CompatError naming the
torch function and the release (meshsim.core.releases): never a TypeError inside a user's script, never a
verdict against torch.
"""

from __future__ import annotations

from ..core.releases import beyond_known
from .patching import PATCHES, CompatError, Patch, problems

__all__ = ["PATCHES", "CompatError", "Patch", "beyond_known", "check", "problems", "registered"]


def registered() -> dict[str, Patch]:
    """Every patch meshsim has, by name (importing the modules that define them registers them)."""
    from . import follow, memo, simgpu, tiers  # noqa: F401

    return dict(PATCHES)


def check(simulated_gpus: bool = False) -> None:
    """Raise CompatError for the first patch a run would install that does not fit the installed torch."""
    from . import follow, simgpu
    from .patching import check as check_patches

    check_patches(list(follow.FOLLOWERS) + (list(simgpu.PATCHES) if simulated_gpus else []))
