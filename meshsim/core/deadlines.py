"""Every deadline meshsim uses, named once, and the one rule that bounds torch's own waits.

A deadline is how long a plan (or a user function) may run before the run is called a hang. torch has waits
of its own (subgroups wait 30 minutes by default, the store 5): every one of them is set to `torch_wait(d)`
for a run of deadline d, so C++ waits end too, shortly after meshsim has diagnosed the hang.
"""

from __future__ import annotations

import math

from .errors import InputError

PLAN_S = 10.0  # a plan: Cluster, fuzz, `meshsim fuzz/run/nightly`, the pytest plugin
SCENARIO_S = 5.0  # a scenario file that names no deadline
FUNCTION_S = 60.0  # a user function (run_fn, a setup function, the recipe examples' training is longer)
EXAMPLE_S = 180.0  # one of the DeviceMesh recipe's examples (FSDP training on 8 CPU ranks)
LAUNCH_S = 300.0  # a script under `meshsim launch`: a training script may take minutes
START_S = 120.0  # workers starting and joining the world
EXPECTED_HANG_S = 3.0  # a plan the model says must hang only needs long enough to show it
SHRINK_S = 120.0  # shrinking a fuzz failure: after this, the smallest failing plan so far stands
DEATH_GRACE_S = 1.0  # after a rank dies, how long the others get to finish before the run is called
TORCH_MARGIN_S = 15.0  # torch's own waits end this long after meshsim's deadline

QUIET_S = 10.0  # a run that hears nothing new from its ranks for this long says what it waits for

# What a plan's default deadline (and the ranks' start) grows by with the world, where ranks share a process or
# the machine's cores. Every group a plan creates is a rendezvous of every rank of the world (torch's store
# barrier); on the thread tier the ranks are threads of one process taking turns, so a plan's work grows with the
# ranks times the groups it makes, about the square of the world (measured on 2 cores: a (4,4,4) plan with a
# check, 0.3 s at 64 ranks; an (8,8,8) one, 25 s at 512), and a machine under load is several times slower.
PROCESS_S_PER_RANK = 0.5  # beyond the first 8 processes on 2 cores
THREAD_S_PER_RANK_SQUARED = 0.0005  # 512 ranks: 131 s more; 1,024 ranks: 524 s more
FAKE_S_PER_THOUSAND = 2.0  # the fake tier's deadline is per rank (one process plays them in turn)
START_S_PER_THREAD = 0.5  # a thread rank joining the world
# A generated plan's step on the thread tier, a rank: the ranks take turns, so a long plan outgrows the world's
# default (a 37-step DTensor plan at 64 ranks: 23 s on a quiet 2-core machine, about 0.01 s a rank a step; under
# load, three times that; its 12 s deadline had been saved by the progress grace, until a loaded CI missed it)
THREAD_S_PER_RANK_STEP = 0.03

MIN_S = 1.0  # shorter cannot tell a hang from a plan that is merely slow on a loaded 2-core machine
MAX_S = 86_400.0  # a day: longer is a typo, and torch's timedelta arithmetic overflows far beyond it


class DeadlineError(InputError):
    """A deadline outside the range meshsim can honour."""


def checked(seconds: object, what: str = "deadline") -> float:
    """`seconds` as a float within [MIN_S, MAX_S], or DeadlineError saying what is wrong."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise DeadlineError(f"{what} must be a number of seconds, got {seconds!r}")
    value = float(seconds)
    if not math.isfinite(value) or not MIN_S <= value <= MAX_S:
        raise DeadlineError(f"{what} must be between {MIN_S:g} and {MAX_S:g} seconds, got {seconds!r}")
    return value


def plan(tier: str, world: int, base: float = PLAN_S) -> float:
    """The default deadline of a plan (`base`: of a small world, PLAN_S or a scenario's SCENARIO_S) on a tier of
    this many ranks: long enough that no honest run of that size is called a hang."""
    if tier == "thread":
        extra = THREAD_S_PER_RANK_SQUARED * world * world
    elif tier == "process":
        extra = PROCESS_S_PER_RANK * max(0, world - 8)
    elif tier == "fake":
        extra = FAKE_S_PER_THOUSAND * world / 1000
    else:
        extra = 0.0
    return min(MAX_S, base + extra)


def for_plan(tier: str, world: int, steps: int, deadline: float) -> float:
    """A plan's deadline on a tier: `deadline`, or on the thread tier at least what its length needs there."""
    if tier != "thread":
        return deadline
    return min(MAX_S, max(deadline, THREAD_S_PER_RANK_STEP * world * steps))


def expected_hang(tier: str, world: int) -> float:
    """How long a plan the model says must hang gets to show it: the hang must be reached first."""
    return min(MAX_S, EXPECTED_HANG_S * plan(tier, world) / PLAN_S)


def start(tier: str, world: int) -> float:
    """The default time the ranks get to start and join the world."""
    return min(MAX_S, START_S + (START_S_PER_THREAD * world if tier == "thread" else 0.0))


def for_tier(tier: str, world: int, deadline: float | None = None, start_timeout: float | None = None
             ) -> tuple[float, float]:
    """An executor's deadline and start timeout: as given (checked), else the tier's defaults for the world."""
    return (checked(deadline) if deadline is not None else plan(tier, world),
            checked(start_timeout, "start timeout") if start_timeout is not None else start(tier, world))


def torch_wait(deadline_s: float) -> float:
    """How long torch's own waits (process groups, the store) may last during a run of this deadline."""
    return deadline_s + TORCH_MARGIN_S
