"""Every change meshsim makes to torch, registered with what it was written against.

A patch names the torch functions it replaces, the releases it was written against and checked on, the
parameters its wrappers read by name (`needs`), and the targets a release may lack (`optional`: left alone
there). Wrappers take `*args, **kwargs` and read what they need through the original's own signature
(`arguments`), so a release that adds a parameter (2.15's `preserve_rank_order`) passes through untouched. A
target that is gone, or a parameter a wrapper reads that is gone, is one CompatError naming the torch function
and the release: found by `problems` before any rank runs user code, never a TypeError inside a user's script.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import releases as versions
from ..core.errors import MeshsimError


class CompatError(MeshsimError):
    """A patch of meshsim's that does not fit the installed torch (one line: the function and the release)."""


@dataclass(frozen=True)
class Patch:
    name: str  # "follow.device-mesh"
    purpose: str  # what a user loses without it
    targets: tuple[str, ...]  # the torch names it replaces, dotted from the module ("torch.cuda.device_count")
    written_for: str  # the releases it was written against and checked on ("2.9.1-2.15.0")
    install: Callable[..., None]
    needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # target -> parameters read by name
    optional: tuple[str, ...] = ()  # targets a release may lack; the patch leaves them alone there


PATCHES: dict[str, Patch] = {}  # by name, in the order they are installed

_MISSING = object()


def patch(name: str, purpose: str, targets: tuple[str, ...], written_for: str = "2.9.1-2.15.0",
          needs: Mapping[str, tuple[str, ...]] | None = None, optional: tuple[str, ...] = ()
          ) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register the decorated function as the patch `name` (installing it is `install(name, ...)`)."""

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        PATCHES[name] = Patch(name, purpose, targets, written_for, fn, dict(needs or {}), optional)
        return fn

    return register


def resolve(dotted: str) -> Any:
    """The object a dotted torch name stands for (a module's attribute, a class's method), or _MISSING."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            value = inspect.getattr_static(value, attr, _MISSING) if isinstance(value, type) else \
                getattr(value, attr, _MISSING)
            if value is _MISSING:
                return _MISSING
        return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    return _MISSING


def _parameters(fn: Any) -> set[str] | None:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return None


def problems(p: Patch) -> list[str]:
    """Why `p` does not fit the installed torch, one line each (empty: it fits)."""
    found = []
    release = versions.installed_text()
    for target in p.targets:
        value = resolve(target)
        if value is _MISSING:
            if target not in p.optional:
                found.append(f"{target} does not exist in torch {release} (meshsim's patch {p.name!r} "
                             f"was written for {p.written_for})")
            continue
        params = _parameters(value) if target in p.needs else None
        gone = sorted(set(p.needs[target]) - params) if params is not None else []
        if gone:
            found.append(f"{target} in torch {release} no longer takes {', '.join(gone)} (meshsim's patch "
                         f"{p.name!r} reads it; written for {p.written_for})")
    return found


def check(names: list[str] | None = None) -> None:
    """Raise CompatError, in one line, for the first registered patch that does not fit the installed torch."""
    for name in names if names is not None else list(PATCHES):
        found = problems(PATCHES[name])
        if found:
            raise CompatError(f"{found[0]}: {PATCHES[name].purpose} cannot work on this torch")


def install(name: str, *args: Any) -> None:
    """Check, then install, the patch `name`."""
    check([name])
    PATCHES[name].install(*args)


def arguments(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name, as `original` itself binds them (defaults left out). Positions are
    named from the signature's plain parameters, read once: inspect's bind cost a rank a twentieth of its plan time
    (torch creates every mesh's groups through followed calls)."""
    names = _positional_names(original)
    if names is None or len(args) > len(names):
        return _signature(original).bind_partial(*args, **kwargs).arguments
    return {**dict(zip(names, args)), **kwargs}


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


@functools.cache
def _positional_names(fn: Callable[..., Any]) -> tuple[str, ...] | None:
    """The names of the parameters a position binds, in order (None: the signature has more than those)."""
    parameters = list(_signature(fn).parameters.values())
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    return tuple(p.name for p in parameters if p.kind in plain)


def wrap(owner: Any, attr: str, around: Callable[..., Any], static: bool = False) -> Any:
    """owner.attr becomes around(original, *args, **kwargs), with the original's name and docstring; returns the
    original. `static`: the attribute is a staticmethod of a class."""
    original = getattr(owner, attr)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return around(original, *args, **kwargs)

    setattr(owner, attr, staticmethod(wrapper) if static else wrapper)
    return original
