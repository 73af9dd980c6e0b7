"""What meshsim raises at its user, named once. Every MeshsimError is a one-line message and, from the command
line, exit code 2; a run that does not pass is not an error but a verdict (meshsim.judge.verdict.Failed when
asked to raise)."""

from __future__ import annotations


class MeshsimError(Exception):
    """Something meshsim cannot do as asked: bad input, or a cluster that cannot serve."""


class InputError(MeshsimError, ValueError):
    """Input that cannot be run: a plan, a scenario, a topology, a deadline, an option; nothing was started."""


class ClusterError(MeshsimError, RuntimeError):
    """The cluster could not start or cannot serve (bad backend, too few GPUs, a rank that fails to join)."""


class SetupError(ClusterError):
    """A setup function that did not pass on the ranks: every later generation would fail the same way."""
