"""meshsim: a simulated multi-host cluster testbed for PyTorch DeviceMesh correctness."""

from .plan import Plan, PlanError, Step, step
from .topology import Topology

__version__ = "0.1.0"


def __getattr__(name: str):
    # Cluster pulls in torch; keep `import meshsim` light for the pure parts (plan, model, topology).
    if name in ("Cluster", "ClusterError"):
        from . import cluster

        return getattr(cluster, name)
    if name == "predict":
        from .model import predict

        return predict
    raise AttributeError(name)


__all__ = ["Plan", "PlanError", "Step", "step", "Topology", "Cluster", "ClusterError", "predict"]
