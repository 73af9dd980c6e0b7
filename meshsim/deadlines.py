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


def torch_wait(deadline_s: float) -> float:
    """How long torch's own waits (process groups, the store) may last during a run of this deadline."""
    return deadline_s + TORCH_MARGIN_S
