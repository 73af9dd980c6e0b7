"""Replay a hang from torch Flight Recorder dumps: read them, rebuild the job, name the culprits, and write
the incident as a meshsim scenario (docs/replay.md)."""
