"""The controller side: a store on loopback, workers started once and reused, deadlines on everything."""

from .controller import BACKENDS, Cluster, resolve_backend
from .generation import ClusterError
from .record import RankState, RunRecord

__all__ = ["Cluster", "ClusterError", "RankState", "RunRecord", "BACKENDS", "resolve_backend"]
