"""meshsim: a simulated multi-host cluster testbed for PyTorch DeviceMesh correctness.

The data path, one package a stage: meshsim.spec (topology, plans, tiers) and meshsim.ops (every operation) ->
meshsim.run (executors: the only code that calls torch.distributed) -> meshsim.core.record (what every run ends in)
-> meshsim.judge (against meshsim.model.predict, the pure reference model's prediction; verdict, culprits, diagnosis)
-> meshsim.judge.report. meshsim.check runs that path for every entry point.
"""

from .spec import Plan, PlanError, Step, Topology, step

__version__ = "0.4.0"


def __getattr__(name: str):
    # Cluster pulls in torch; keep `import meshsim` light for the pure parts (plan, model, topology).
    if name == "Cluster":
        from .cluster import Cluster

        return Cluster
    if name == "ClusterError":
        from .core.errors import ClusterError

        return ClusterError
    if name == "Verdict":
        from .judge.verdict import Verdict

        return Verdict
    if name == "predict":
        from .model.predict import predict

        return predict
    if name == "check":
        from .check import check

        return check
    if name == "launch":
        from .launch import launch

        return launch
    raise AttributeError(name)


__all__ = ["Plan", "PlanError", "Step", "step", "Topology", "Cluster", "ClusterError", "Verdict", "predict", "check",
           "launch"]
