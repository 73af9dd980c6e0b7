"""meshsim: a simulated multi-host cluster testbed for PyTorch DeviceMesh correctness.

The data path, one package a stage: meshsim.spec (topology, plans) and meshsim.ops (every operation) ->
meshsim.run (executors: the only code that calls torch.distributed) -> meshsim.model (pure reference model) ->
meshsim.judge (verdict, hang diagnosis) -> meshsim.report. meshsim.check runs that path for every entry point.
"""

from .spec import Plan, PlanError, Step, Topology, step

__version__ = "0.2.0"


def __getattr__(name: str):
    # Cluster pulls in torch; keep `import meshsim` light for the pure parts (plan, model, topology).
    if name in ("Cluster", "ClusterError"):
        from . import run

        return getattr(run, name)
    if name == "predict":
        from .predict import predict

        return predict
    if name == "check":
        from .check import check

        return check
    if name == "launch":
        from .launcher import launch

        return launch
    raise AttributeError(name)


__all__ = ["Plan", "PlanError", "Step", "step", "Topology", "Cluster", "ClusterError", "predict", "check", "launch"]
