"""The tiers that run work, named once: what each can run and check, and how large a world it takes.

Pure data: the CLI's help and choices, the executors' limits and the refusals before a run all read it here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import InputError


@dataclass(frozen=True)
class Capabilities:
    """What an executor can run and what it can check; refused before a run starts, in one line."""

    max_world: int
    functions: bool = True  # user functions (run_fn, setup)
    scripts: bool = False  # user scripts (meshsim launch)
    moves_data: bool = True  # collectives move data, so their values are checked
    hangs: bool = True  # a run can hang, and the hang is diagnosed
    dtensor: bool = True  # DTensor steps run and are checked
    backends: tuple[str, ...] = ("gloo",)  # what backend= may name
    setup: bool = False  # a setup function on every rank of every generation
    describe: str = ""  # what it is, for --help and docs/tiers.md


TIERS: dict[str, Capabilities] = {
    "process": Capabilities(64, scripts=True, backends=("gloo", "nccl", "cpu:gloo,cuda:nccl", "auto"), setup=True,
                            describe="a process per rank, gloo (NCCL on GPUs); everything is checked"),
    "thread": Capabilities(1024, describe="threads of one process on torch's threaded process group; collective "
                                          "values checked"),
    "fake": Capabilities(1 << 20, functions=False, moves_data=False, hangs=False, dtensor=False,
                         describe="each rank alone on torch's fake process group: meshes, groups, coordinates and "
                                  "errors, not collective values, DTensor steps or hangs"),
    "model": Capabilities(1 << 20, functions=False, moves_data=False, hangs=True, dtensor=True,
                          describe="the reference model alone: its own predictions, torch does not run"),
}


class TierError(InputError):
    """An unknown tier, options a tier does not take, or work it cannot run (one line, exit 2)."""


def capabilities(tier: str) -> Capabilities:
    if tier not in TIERS:
        raise TierError(f"unknown tier {tier!r}; choose one of {', '.join(TIERS)}")
    return TIERS[tier]
