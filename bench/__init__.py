"""meshsim's benchmarks: `python -m bench` runs every section, each figure beside its anchor measured in the same run
(see bench/__main__.py)."""
