"""Plans: pure data that every rank runs step by step (SPMD), with optional per-rank divergence.

What each op means, and whether a step is well formed, is meshsim.ops' business (meshsim.ops.validate).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import tomli_w

from .fields import PlanError, flatten_layout, layout_shape

__all__ = ["Plan", "Step", "PlanError", "step", "flatten_layout", "layout_shape", "restrict_view"]

HANDLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_STEPS = 10_000
# Keys every step may carry besides its op's fields.
STEP_KEYS = ("op", "out", "only_on", "skip_on", "on_rank", "expect_error")


@dataclass(frozen=True)
class Step:
    op: str
    args: Mapping[str, Any] = field(default_factory=dict)
    out: str | None = None
    only_on: tuple[int, ...] | None = None  # run only on these ranks
    skip_on: tuple[int, ...] = ()  # every rank but these
    on_rank: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)  # per-rank field overrides
    expect_error: bool = False  # the author means this step to raise

    def runs_on(self, rank: int) -> bool:
        if rank in self.skip_on:
            return False
        return self.only_on is None or rank in self.only_on

    def args_for(self, rank: int) -> dict[str, Any]:
        merged = dict(self.args)
        merged.update(self.on_rank.get(rank, {}))
        return merged

    @property
    def diverges(self) -> bool:
        """Whether some ranks run this step differently from others (or not at all)."""
        return bool(self.only_on is not None or self.skip_on or self.on_rank)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        out.update(self.args)
        if self.out is not None:
            out["out"] = self.out
        if self.only_on is not None:
            out["only_on"] = list(self.only_on)
        if self.skip_on:
            out["skip_on"] = list(self.skip_on)
        if self.on_rank:
            out["on_rank"] = {str(r): dict(v) for r, v in sorted(self.on_rank.items())}
        if self.expect_error:
            out["expect_error"] = True
        return out

    def __repr__(self) -> str:
        parts = [repr(self.op)] + [f"{k}={v!r}" for k, v in self.args.items()]
        for key in ("out", "only_on", "skip_on", "on_rank", "expect_error"):
            value = getattr(self, key)
            if value not in (None, (), {}, False):
                parts.append(f"{key}={list(value) if isinstance(value, tuple) else value!r}")
        return f"step({', '.join(parts)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    def describe(self) -> str:
        """One line, as a person would write the call."""
        args = ", ".join(f"{k}={_short(v)}" for k, v in self.args.items())
        text = f"{self.out} = {self.op}({args})" if self.out else f"{self.op}({args})"
        if self.only_on is not None:
            text += f" only on {list(self.only_on)}"
        if self.skip_on:
            text += f" skipped on {list(self.skip_on)}"
        for rank, over in sorted(self.on_rank.items()):
            text += f"; on rank {rank}: " + ", ".join(f"{k}={_short(v)}" for k, v in over.items())
        return text


def _short(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else repr(value)


def step(op: str, **kwargs: Any) -> Step:
    """step("slice", src="m", names=["tp"], out="s") -- the keyword form plans are written in."""
    meta = {k: kwargs.pop(k) for k in STEP_KEYS if k in kwargs}
    return _step_from(op, {k: v for k, v in kwargs.items() if v is not None}, meta)


def _step_from(op: str, args: dict[str, Any], meta: Mapping[str, Any]) -> Step:
    """A step as written; values of the wrong type are kept as they are for validate() to name."""
    on_rank = meta.get("on_rank") or {}
    if isinstance(on_rank, Mapping):
        on_rank = {_rank_key(k): dict(v) if isinstance(v, Mapping) else v for k, v in on_rank.items()}
    return Step(
        op=op,
        args=args,
        out=meta.get("out"),
        only_on=_as_tuple(meta.get("only_on")),
        skip_on=_as_tuple(meta.get("skip_on")) or (),
        on_rank=on_rank,
        expect_error=False if meta.get("expect_error") is None else meta["expect_error"],
    )


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _rank_key(key: Any) -> Any:
    if isinstance(key, str) and re.fullmatch(r"-?[0-9]{1,9}", key.strip()):
        return int(key)
    return key


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        inner = ",\n    ".join(repr(s) for s in self.steps)
        return f"Plan((\n    {inner},\n))"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # Hypothesis prints falsifying plans this way: eval-able, one step a line

    @property
    def diverges(self) -> bool:
        return any(s.diverges for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": [s.to_dict() for s in self.steps]}
        if self.name:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        raw = data.get("step", data.get("steps"))
        if not isinstance(raw, list) or not raw:
            raise PlanError("a plan needs a non-empty list of steps ([[step]] tables)")
        steps = []
        for index, item in enumerate(raw):
            if not isinstance(item, Mapping) or "op" not in item:
                raise PlanError(f"step {index}: every step needs an 'op'")
            item = dict(item)
            op = item.pop("op")
            meta = {k: item.pop(k) for k in STEP_KEYS if k in item}
            steps.append(_step_from(op, item, meta))
        return cls(tuple(steps), name=str(data.get("name", "")))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    @classmethod
    def from_toml(cls, text: str) -> Plan:
        return cls.from_dict(tomllib.loads(text))

    def describe(self) -> list[str]:
        return [f"{i}: {s.describe()}" for i, s in enumerate(self.steps)]


def restrict_view(view: Any, coordinate: tuple[int, ...], shape: tuple[int, ...],
                  dims: list[int]) -> tuple[list[int], tuple[int, ...]]:
    """A mesh as one rank sees it, kept along `dims` (in that order) and fixed elsewhere at its coordinate.

    This is the layout `from_group` uses by default for several dims: the source mesh seen from this rank.
    """
    out_shape = tuple(shape[i] for i in dims)
    flat = []
    for index in range(math.prod(out_shape)):
        coord = list(coordinate)
        rest = index
        for pos in reversed(range(len(dims))):
            coord[dims[pos]] = rest % out_shape[pos]
            rest //= out_shape[pos]
        cell = view
        for c in coord:
            cell = cell[c]
        flat.append(cell)
    return flat, out_shape


def steps(*items: Step | Iterable[Step]) -> Plan:
    """Plan from steps (convenience for tests and users)."""
    flat: list[Step] = []
    for item in items:
        flat.extend([item] if isinstance(item, Step) else item)
    return Plan(tuple(flat))
