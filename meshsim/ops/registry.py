"""The registry of operations: each defined once, with every part it needs (see meshsim.ops)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..spec import fields as F

ROLES = ("root", "derive", "query", "collective", "dtensor", "group", "fault")


@dataclass(frozen=True)
class Operation:
    name: str
    doc: str
    role: str  # how the strategies use it: root meshes, derived meshes, queries, collectives, groups, faults
    fields: dict[str, F.Kind]
    required: tuple[str, ...]
    produces: str | None  # what its `out` handle holds
    creates_groups: bool  # every rank must take part (members or not), like new_group
    model: Callable[..., Any]
    torch: Callable[..., Any]
    draw: Callable[..., Any]
    check_args: Callable[[dict], None] = field(default=lambda args: None)
    weight: int = 0  # how often meshsim.sweep.strategies.plans draws it, by how much of torch it reaches
    needs: str | None = None  # the rule of meshsim.model.semantics a release must hold to have it
    # the key of its observation that is torch's choice, not its contract (a sharding strategy's placements):
    # the model predicts with what torch chose there (meshsim.model.choices)
    chooses: str | None = None

    # the rule a step's arguments need beyond the op's own (a keyword, a query a release lacks), or None
    needs_of: Callable[[dict], str | None] = field(default=lambda args: None)

    def rule_for(self, args: dict | None = None) -> str | None:
        """The rule of meshsim.model.semantics the release must hold to run this op with these arguments."""
        return self.needs or (self.needs_of(args) if args is not None else None)

    def available(self, on: Any, args: dict | None = None) -> bool:
        """Whether the torch of `on` (a Platform, or a release) has this op with these arguments."""
        rule = self.rule_for(args)
        return rule is None or holds(rule, on)


OPERATIONS: dict[str, Operation] = {}
PARTS = ("model", "torch", "draw")
# Roots start plans (meshsim.sweep.strategies.root_steps) and faults make them diverge (divergent_plans); every other
# role is drawn by plans() in proportion to its weight, so one without a weight would never be drawn.
DRAWN_ELSEWHERE = ("root", "fault")


def operation(name: str, role: str, fields: dict[str, F.Kind] | None = None, required: tuple[str, ...] = (),
              produces: str | None = None, creates_groups: bool = False, weight: int = 0, needs: str | None = None
              ) -> Callable[[type], Operation]:
    """Register the class it decorates as operation `name`: its docstring is the op's doc, its functions
    `model`, `torch`, `draw` (and optionally `check_args`) are the parts; `chooses`, where it has one, the
    observation key that is torch's choice; `needs_of(args)`, where a keyword or a query needs a release."""

    def register(cls: type) -> Operation:
        missing = [part for part in PARTS if not callable(getattr(cls, part, None))]
        if missing:
            raise TypeError(f"operation {name!r} lacks {', '.join(missing)}")
        if role not in ROLES or name in OPERATIONS:
            raise TypeError(f"operation {name!r}: bad role {role!r} or defined twice")
        if (weight > 0) == (role in DRAWN_ELSEWHERE):
            raise TypeError(f"operation {name!r}: a {role} op needs "
                            + ("no weight (it is drawn elsewhere)" if role in DRAWN_ELSEWHERE else "a weight > 0"))
        parts = {part: getattr(cls, part) for part in PARTS}
        op = Operation(name, (cls.__doc__ or "").strip(), role, dict(fields or {}), required, produces,
                       creates_groups, parts["model"], parts["torch"], parts["draw"],
                       getattr(cls, "check_args", lambda args: None), weight, needs, getattr(cls, "chooses", None),
                       getattr(cls, "needs_of", lambda args: None))
        OPERATIONS[name] = op
        return op

    return register


def holds(rule: str, on: Any) -> bool:
    """Whether a rule of meshsim.model.semantics holds on `on` (a Platform or a release): for the ops' model
    parts (the ranks, which run the torch parts, never load the model)."""
    from ..model.semantics import holds as rule_holds

    return rule_holds(rule, on)


def rarely(draw: Callable[..., Any], one_in: int) -> bool:
    """True once in `one_in` draws. The rare branch sits at the top of the range, so that shrinking (which moves
    integers toward 0) leaves it: a counterexample keeps an exotic choice only when the failure needs it."""
    from hypothesis import strategies as st

    return draw(st.integers(0, one_in - 1)) == one_in - 1


def of_role(*roles: str) -> list[Operation]:
    return [op for op in OPERATIONS.values() if op.role in roles]
