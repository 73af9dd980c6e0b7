"""The property sweep, meshsim's main job (`meshsim fuzz`, `meshsim nightly`, pytest's check_property).

strategies.py draws topologies and plans with Hypothesis (compose.py's mesh compositions, cells.py's DTensor chains
and redistribute cells), after matrix.py's plans, which every sweep runs first; loop.py runs them on a cluster
through meshsim.check, shrinks a failure and saves it as a scenario file; produced.py counts what the agreeing
runs produced and checked; coverage.py measures which of torch's DeviceMesh and DTensor lines the ranks reached;
nightly.py is the same sweep with the scenarios, on NCCL or under torchrun.

    from meshsim.sweep import plans, fuzz
"""

from .loop import FuzzReport, fuzz
from .strategies import divergent_plans, matrix_plans, plans, topologies, topology_plans

__all__ = ["FuzzReport", "divergent_plans", "fuzz", "matrix_plans", "plans", "topologies", "topology_plans"]
