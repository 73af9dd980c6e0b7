"""The vocabulary every stage shares, named once: what meshsim raises (errors), how long anything may wait
(deadlines), ranks in words (ranks), the messages between the controller and the ranks (wire), what every run
ends in (record) and how a run ends (outcome). Pure Python: no torch, nothing of meshsim above it."""
