"""The judge: observations against the model, one rule for every source of runs (plans, functions, scripts, replays)."""
