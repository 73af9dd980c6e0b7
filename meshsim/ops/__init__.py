"""Every operation of the plan language, each defined once: its fields, its model step, its torch step and its
Hypothesis strategy, side by side.

    model(run, args)   what the reference model predicts this rank observes (meshsim.model.predict.RankRun)
    torch(ex, args)    what torch does on this rank (meshsim.run.interpreter.Interpreter); torch is imported
                       inside, so the model and the strategies stay free of it
    draw(draw, b, handle, mesh, allow_errors)
                       a Hypothesis draw of one such step for the plan being built (meshsim.sweep.strategies),
                       or None when it does not fit there

The registry refuses an operation that lacks any part, so a plan step can never reach a rank that has no
torch step for it (which would read as torch disagreeing with the model).
"""

from __future__ import annotations

from typing import Any

from .registry import OPERATIONS, PARTS, ROLES, Operation, of_role, operation, rarely

__all__ = ["OPERATIONS", "PARTS", "ROLES", "Operation", "of_role", "operation", "operation_of", "rarely",
           "reference_markdown", "validate"]


def operation_of(st: Any) -> Operation:
    """The definition of a plan step's op (validated plans only name known ops)."""
    return OPERATIONS[st.op]


from . import collectives, dtensor, faults, layouts, meshes, queries  # noqa: E402,F401  -- each registers its operations
from .validate import validate  # noqa: E402


def reference_markdown() -> str:
    """The plan language's reference, generated from the definitions (docs/plan-language.md embeds it; a test
    keeps it equal)."""
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
