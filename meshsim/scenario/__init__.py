"""Scenario files: a topology, a plan and what must happen, in TOML (`meshsim run FILE`).

files.py reads, validates, writes and judges them; a counterexample the sweep shrank and an incident replayed
from Flight Recorder dumps are saved as one.
"""

from .files import Expect, Scenario, ScenarioError, judge_scenario, load, parse

__all__ = ["Expect", "Scenario", "ScenarioError", "judge_scenario", "load", "parse"]
