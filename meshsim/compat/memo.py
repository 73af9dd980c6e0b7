"""DeviceMesh's layout arithmetic, remembered by value on the ranks that serve plans.

torch computes a mesh's ranks from its _MeshLayout (CuTe-style sizes and strides) with pure-Python integer
arithmetic (`collapse`, `complement`, `cosize`), and recomputes it on every `DeviceMesh.mesh`, every group a mesh
makes and every slice. A sweep's ranks build the same few layouts thousands of times: that arithmetic was a third
of a rank's CPU in a sweep (cProfile, 480 examples on 2 x 4). The layouts are frozen dataclasses compared by value
and these methods are functions of the layout (and the world size) alone, so each answer is computed once by
torch's own method and handed out again for an equal layout. The tensors are torch's (`remap_to_tensor` itself
is not touched and runs every time), so a bug in the arithmetic still shows: it is computed by the same code,
with the same inputs, once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .patching import patch, wrap

LAYOUTS = "torch.distributed._mesh_layout"
# 2.13 and later: _FlatLayout (one axis) and _MeshLayout (a tuple of them); 2.10-2.12: _MeshLayout alone
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
    answer = functools.lru_cache(maxsize=REMEMBER_AT_MOST)(original)

    def remembered(_original: Any, self: Any, *args: Any) -> Any:
        try:
            return answer(self, *args)
        except TypeError:  # an argument that is not hashable (never in torch's own calls): as torch computes it
            return _original(self, *args)

    wrap(owner, method, remembered)
    getattr(owner, method)._meshsim_memo = True
    _originals[(owner, method)] = original


_originals: dict[tuple[type, str], Any] = {}


def install() -> None:
    """Once a process (the thread tier's ranks share one)."""
    if not _originals:
        from .patching import install as install_patch

        install_patch("speed.layout-memo")


@contextmanager
def unremembered() -> Iterator[None]:
    """torch's own methods for a while: a benchmark's raw-torch anchor that runs in this process (the thread tier's
    baseline) must not borrow meshsim's memo."""
    remembered = {key: getattr(key[0], key[1]) for key in _originals}
    for (owner, method), original in _originals.items():
        setattr(owner, method, original)
    try:
        yield
    finally:
        for (owner, method), wrapper in remembered.items():
            setattr(owner, method, wrapper)
