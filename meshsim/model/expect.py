"""What the model predicts a rank observes: plain JSON values, errors, and quirks (spec vs torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.wire import is_error


@dataclass(frozen=True)
class Err:
    """An exception of `type` whose message contains `match` (type None: any exception)."""

    type: str | None
    match: str = ""

    def matches(self, observed: Any) -> bool:
        if not is_error(observed):
            return False
        kind, message = observed["error"]
        return (self.type is None or kind == self.type) and self.match.lower() in message.lower()

    def to_json(self) -> dict[str, Any]:
        return {"error": [self.type or "any exception", self.match]}


UNPREDICTED = "unpredicted"  # torch's side of a Quirk the model does not simulate: any observation is torch's


@dataclass(frozen=True)
class Quirk:
    """Where torch does something other than what is right: both values, and the finding explaining it."""

    right: Any
    torch: Any
    finding: str


class ModelRaise(Exception):
    """Raised inside the model where torch raises; carries the expected error."""

    def __init__(self, err: Err | Quirk):
        super().__init__(err)
        self.err = err


def to_json(value: Any) -> Any:
    """An expectation as plain JSON (for reports and scenario files)."""
    if isinstance(value, Err):
        return value.to_json()
    if isinstance(value, Quirk):
        return {"right": to_json(value.right), "torch": to_json(value.torch), "finding": value.finding}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def quirk(right: Any, torch: Any, finding: str) -> Any:
    """A Quirk only where the two differ."""
    return right if right == torch else Quirk(right, torch, finding)


class Grid(list[Any]):
    """A mesh's ranks as nested lists, plain ints all the way down: whoever walks an expectation for what it holds
    (a Quirk, an error) can skip it, however large the mesh (a million ranks)."""


def torch_side(value: Any) -> Any:
    """What torch itself is predicted to show (quirks resolved to torch's side)."""
    if type(value) is Grid:
        return value
    if isinstance(value, Quirk):
        return torch_side(value.torch)
    if isinstance(value, dict):
        return {k: torch_side(v) for k, v in value.items()}
    if isinstance(value, list):
        return [torch_side(v) for v in value]
    return value
