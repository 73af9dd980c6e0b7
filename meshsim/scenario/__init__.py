"""Scenario files: a topology, a plan and what must happen, in TOML (`meshsim run FILE`).

files.py reads, validates, writes and judges them; a counterexample the sweep shrank and an incident replayed
from Flight Recorder dumps are saved as one. formats.py: the `format` a file names and the rules of each (a file
without one is read as meshsim 0.2 meant it); upgrade.py: `meshsim run --upgrade`, an older file rewritten in the
current format. docs/scenarios.md says it for users.
"""

from .files import Expect, Scenario, ScenarioError, judge_scenario, load, parse

__all__ = ["Expect", "Scenario", "ScenarioError", "judge_scenario", "load", "parse"]
