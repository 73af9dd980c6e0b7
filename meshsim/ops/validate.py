"""Whether a plan is well formed: every step's op, fields, handles and ranks, checked against the op's definition.

Validation checks only what a plan *says* (meshsim.spec.fields), never what torch will do with it: that is the
model's job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..core.releases import Release, installed
from ..spec.fields import Context, PlanError
from ..spec.plan import HANDLE, MAX_STEPS, Plan, Step
from ..spec.platform import Platform
from .registry import OPERATIONS


def validate(plan: Plan, world: int | None = None, on: Platform | Release | None = None) -> Plan:
    """Raise PlanError naming the first step that is malformed, or that the torch of `on` (a Platform or a release;
    default: the installed one) does not have; return the plan otherwise."""
    from ..model.semantics import needs  # (the ranks load the ops, and never the model)

    release = installed() if on is None else on
    if len(plan.steps) > MAX_STEPS:
        raise PlanError(f"a plan has at most {MAX_STEPS} steps, this one {len(plan.steps)}")
    handles: dict[str, str] = {}  # handle -> what produced it
    for index, st in enumerate(plan.steps):
        try:
            _validate_step(st, handles, world)
            _available(st, release, needs)
        except PlanError as exc:
            raise PlanError(f"step {index} ({st.op}): {exc}") from None
        if st.out is not None:
            handles[st.out] = OPERATIONS[st.op].produces or ""
    return plan


def runs_on(st: Step, platform: Platform, left_out: set[str]) -> bool:
    """Whether a drawn or built step stays in a plan for `platform`'s release: its op exists there and every handle
    it names was made. A step left out adds its handle to `left_out`, so that what uses it goes too."""
    names = [v for value in st.args.values() for v in (value if isinstance(value, list) else [value])
             if isinstance(v, str)]
    if OPERATIONS[st.op].available(platform, dict(st.args)) and not any(n.split(".")[0] in left_out for n in names):
        return True
    if st.out:
        left_out.add(st.out)
    return False


def runnable(steps: list[Step], platform: Platform | None = None) -> Plan:
    """The plan of `steps` that `platform`'s release (default: the installed torch) can run (see runs_on)."""
    on, left_out = platform or Platform(), set[str]()
    return Plan(tuple(st for st in steps if runs_on(st, on, left_out)))


def _available(st: Step, release: Platform | Release, needs: Callable[[str, Platform | Release], str | None]) -> None:
    """Refuse a step the release lacks (its op, or a keyword or query it names): "needs torch >= 2.10.0; ..."."""
    every = [dict(st.args)] + [st.args_for(r) for r in st.on_rank]
    for rule in sorted({r for args in every if (r := OPERATIONS[st.op].rule_for(args)) is not None}):
        missing = needs(rule, release)
        if missing:
            raise PlanError(missing)


def _validate_step(st: Step, handles: dict[str, str], world: int | None) -> None:
    if not isinstance(st.op, str) or st.op not in OPERATIONS:
        raise PlanError(f"unknown op {st.op!r}; known ops: {', '.join(sorted(OPERATIONS))}")
    operation = OPERATIONS[st.op]
    if not isinstance(st.expect_error, bool):
        raise PlanError(f"expect_error must be true or false, got {st.expect_error!r}")
    ctx = Context(world, handles, st.expect_error, no_backend=isinstance(st.args, Mapping)
                  and st.args.get("init_backend") is False)
    if not isinstance(st.args, Mapping):
        raise PlanError("fields must be a table")
    unknown = set(st.args) - set(operation.fields)
    if unknown:
        raise PlanError(f"unknown field {sorted(map(str, unknown))[0]!r}; {st.op} takes "
                        f"{sorted(operation.fields) or 'no fields'}")
    for name in operation.required:
        if name not in st.args:
            raise PlanError(f"missing field {name!r}")
    if operation.produces and not st.out:
        raise PlanError("needs 'out', the handle it defines")
    if not operation.produces and st.out:
        raise PlanError(f"{st.op} produces nothing, so it takes no 'out'")
    if st.out is not None and not (isinstance(st.out, str) and HANDLE.match(st.out)):
        raise PlanError(f"handle {st.out!r} must be an identifier")
    if st.only_on is not None:
        ctx.ranks("only_on", st.only_on)
    ctx.ranks("skip_on", st.skip_on)
    if not isinstance(st.on_rank, Mapping):
        raise PlanError("on_rank must be a table of rank -> fields")
    for rank, over in st.on_rank.items():
        ctx.rank(f"on_rank key {rank!r}", rank)
        if not isinstance(over, Mapping):
            raise PlanError(f"on_rank.{rank} must be a table of fields")
        bad = set(over) - set(operation.fields)
        if bad:
            raise PlanError(f"on_rank.{rank} overrides unknown field {sorted(map(str, bad))[0]!r}")
    for args in [dict(st.args)] + [st.args_for(r) for r in st.on_rank]:
        for name, value in args.items():
            operation.fields[name].check(name, value, ctx)
        operation.check_args(args)
