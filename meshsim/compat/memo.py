"""DeviceMesh's layout arithmetic, remembered by value on the ranks that serve plans.

torch computes a mesh's ranks from its _MeshLayout (CuTe-style sizes and strides) with pure-Python integer
arithmetic (`collapse`, `complement`, `cosize`), and recomputes it on every `DeviceMesh.mesh`, every group a mesh
makes and every slice. A sweep's ranks build the same few layouts thousands of times: that arithmetic was a third
of a rank's CPU in a sweep (cProfile, 480 examples on 2 x 4). The layouts are frozen dataclasses compared by value
and these methods are functions of the layout (and the world size) alone, their answers immutable (ints, frozen
layouts), so each answer is computed once by torch's own method and handed out again for an equal layout and
equal arguments of the same types. The tensors are torch's (`remap_to_tensor` itself is not touched and runs
every time), so a bug in the arithmetic still shows: it is computed by the same code, with the same inputs, once.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from .patching import patch, wrap

LAYOUTS = "torch.distributed._mesh_layout"
# Those a release has are remembered: torch 2.13-2.15 have _MeshLayout.collapse and .cosize and
# _FlatLayout.complement; 2.10-2.12 _MeshLayout.complement and .cosize; 2.9 none (no layouts under DeviceMesh).
METHODS = (("_FlatLayout", "complement"), ("_FlatLayout", "cosize"), ("_MeshLayout", "complement"),
           ("_MeshLayout", "collapse"), ("_MeshLayout", "cosize"))
REMEMBER_AT_MOST = 4096  # answers per method: a sweep meets a few hundred layouts


@patch("speed.layout-memo", "a sweep's speed (DeviceMesh's layout arithmetic computed once per layout)",
       tuple(f"{LAYOUTS}.{owner}.{method}" for owner, method in METHODS),
       optional=tuple(f"{LAYOUTS}.{owner}.{method}" for owner, method in METHODS))
def _install() -> None:
    import importlib

    try:
        layouts: Any = importlib.import_module(LAYOUTS)
    except ImportError:  # torch 2.9: DeviceMesh keeps no layout
        return
    for owner_name, method in METHODS:
        owner = getattr(layouts, owner_name, None)
        if owner is not None and method in vars(owner) and not getattr(owner.__dict__[method], "_meshsim_memo", 0):
            _remember(owner, method)


def _remember(owner: type, method: str) -> None:
    original = getattr(owner, method)
    # typed: complement(8) and complement(8.0) are told apart, as torch tells them apart
    answer = functools.lru_cache(maxsize=REMEMBER_AT_MOST, typed=True)(original)

    def remembered(_original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs or not _hashable(self, args):  # never so in torch's own calls: as torch computes it
            return _original(self, *args, **kwargs)
        return answer(self, *args)

    wrap(owner, method, remembered)
    getattr(owner, method)._meshsim_memo = True


def _hashable(self: Any, args: tuple) -> bool:
    try:
        hash((self, *args))
    except TypeError:  # a SymInt under tracing, say
        return False
    return True


_lock = threading.Lock()
_installed = False


def install() -> None:
    """Once a process: the thread tier's ranks share one, and build their sessions at the same time."""
    global _installed
    with _lock:
        if not _installed:
            from .patching import install as install_patch

            install_patch("speed.layout-memo")
            _installed = True
