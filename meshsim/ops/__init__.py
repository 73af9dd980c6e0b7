"""Every operation of the plan language, each defined once: its fields, its model step, its torch step and its
Hypothesis strategy, side by side.

    model(run, args)   what the reference model predicts this rank observes (meshsim.model.predict.RankRun)
    torch(ex, args)    what torch does on this rank (meshsim.run.interpreter.Interpreter); torch is imported
                       inside, so the model and the strategies stay free of it
    draw(draw, b, handle, mesh, allow_errors)
                       a Hypothesis draw of one such step for the plan being built (meshsim.strategies),
                       or None when it does not fit there

The registry refuses an operation that lacks any part, so a plan step can never reach a rank that has no
torch step for it (which would read as torch disagreeing with the model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

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


OPERATIONS: dict[str, Operation] = {}
PARTS = ("model", "torch", "draw")


def operation(name: str, role: str, fields: dict[str, F.Kind] | None = None, required: tuple[str, ...] = (),
              produces: str | None = None, creates_groups: bool = False) -> Callable[[type], Operation]:
    """Register the class it decorates as operation `name`: its docstring is the op's doc, its functions
    `model`, `torch`, `draw` (and optionally `check_args`) are the parts."""

    def register(cls: type) -> Operation:
        missing = [part for part in PARTS if not callable(getattr(cls, part, None))]
        if missing:
            raise TypeError(f"operation {name!r} lacks {', '.join(missing)}")
        if role not in ROLES or name in OPERATIONS:
            raise TypeError(f"operation {name!r}: bad role {role!r} or defined twice")
        op = Operation(name, (cls.__doc__ or "").strip(), role, dict(fields or {}), required, produces,
                       creates_groups, cls.model, cls.torch, cls.draw,
                       getattr(cls, "check_args", lambda args: None))
        OPERATIONS[name] = op
        return op

    return register


def rarely(draw: Callable[..., Any], one_in: int) -> bool:
    """True once in `one_in` draws. The rare branch sits at the top of the range, so that shrinking (which moves
    integers toward 0) leaves it: a counterexample keeps an exotic choice only when the failure needs it."""
    from hypothesis import strategies as st

    return draw(st.integers(0, one_in - 1)) == one_in - 1


def of_role(*roles: str) -> list[Operation]:
    return [op for op in OPERATIONS.values() if op.role in roles]


from . import collectives, dtensor, faults, meshes, queries  # noqa: E402,F401  -- each registers its operations


def reference_markdown() -> str:
    """The plan language's reference, generated from the definitions (the README embeds it; a test keeps it equal)."""
    from ..spec.plan import STEP_KEYS

    lines = ["| op | what it does | fields (required in bold) |", "| --- | --- | --- |"]
    for op in sorted(OPERATIONS.values(), key=lambda o: (ROLES.index(o.role), o.name)):
        fields = ", ".join((f"**{n}**" if n in op.required else n) + f" ({kind.meaning})"
                           for n, kind in op.fields.items()) or "none"
        if op.produces:
            fields += f"; **out**: the handle of the {op.produces.replace('_', ' ')} it makes"
        doc = " ".join(op.doc.split()).replace("|", "\\|")
        lines.append(f"| `{op.name}` | {doc} | {fields} |")
    lines.append("")
    lines.append("Every step also takes: " + ", ".join(f"`{k}`" for k in STEP_KEYS if k not in ("op", "out"))
                 + " (`only_on`/`skip_on`: lists of ranks; `on_rank`: a table of rank → field overrides; "
                 "`expect_error`: the author means the step to raise).")
    return "\n".join(lines)
