"""What to run: a topology of simulated hosts, and a plan of steps in the plan language. Pure data."""

from .fields import PlanError
from .plan import Plan, Step, step
from .topology import Topology, TopologyError

__all__ = ["Plan", "PlanError", "Step", "Topology", "TopologyError", "step"]
