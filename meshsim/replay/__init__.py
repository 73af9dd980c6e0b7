"""Replay a hang from torch Flight Recorder dumps: read them, rebuild the job, name the culprits, and write
the incident as a meshsim scenario that `meshsim run` replays (docs/replay.md).

    dumps = read_dir("dumps/")                  # one file a rank; ReplayError (one line) if unreadable
    incident = build(dumps)                     # world, groups, meshes, each rank's calls (pure Python); where
                                                # the dumps show no rank, it is placed from its peers' (absent.py)
    analysis = analyze(incident)                # culprits from per-group counts, victims, notes
    replay = to_scenario(incident, analysis)    # .data (TOML table), .save(path), .scenario() (validated)
    record = to_record(incident, analysis)      # meshsim.core.record.RunRecord for meshsim's judge
    answer = run_torch(dumps, incident)         # torch's own analyzer on the same dumps, for comparison

`main(args)` and `add_arguments(parser)` are the `meshsim replay` command.
"""

from .analyze import Analysis, analyze, to_record
from .cli import add_arguments, main
from .dumps import ReplayError, read_dir
from .incident import build
from .records import Incident
from .to_scenario import to_scenario
from .torch_analyzer import run_torch

__all__ = ["Analysis", "Incident", "ReplayError", "add_arguments", "analyze", "build", "main", "read_dir",
           "run_torch", "to_record", "to_scenario"]
