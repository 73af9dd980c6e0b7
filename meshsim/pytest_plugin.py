"""pytest plugin (auto-loaded through the `pytest11` entry point).

Fixtures:
    meshsim_cluster   a running cluster shared by the whole session (one per xdist worker), of the topology
                      given by --meshsim-topology (default 2x4) and --meshsim-backend (default gloo).
    meshsim_pool      clusters by (topology, backend), started on first use and kept for the session.
    meshsim           a per-test helper whose cluster follows @pytest.mark.meshsim(topology=..., backend=...),
                      with .run(plan), .assert_agrees(plan), .check_property(...), .run_fn(fn), and
                      .launch(script) for a user's own torchrun script on the same topology.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest

from .core.deadlines import FUNCTION_S, PLAN_S

MAX_ALIVE = 2  # clusters kept at once per test process (each rank holds ~200 MB)


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("meshsim", "simulated DeviceMesh clusters")
    group.addoption("--meshsim-topology", default="2x4", help="HxD of the session cluster (default 2x4)")
    group.addoption("--meshsim-backend", default="gloo", help="gloo | nccl | auto (default gloo)")
    group.addoption("--meshsim-deadline", type=float, default=PLAN_S,
                    help=f"seconds a plan may take (default {PLAN_S:g}; a function run_fn runs: {FUNCTION_S:g})")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers", "meshsim(topology='2x4', backend='gloo', deadline=None): the cluster the `meshsim` fixture uses")


class ClusterPool:
    """Clusters by (topology, backend), started lazily and reused; the least recently used is closed."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.clusters: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.pinned: set[tuple[str, str]] = set()  # held for the whole session (meshsim_cluster): never closed

    def get(self, topology: str = "2x4", backend: str = "gloo", pin: bool = False) -> Any:
        from .cluster import Cluster
        from .spec.topology import Topology

        key = (topology, backend)
        if pin:
            self.pinned.add(key)
        if key in self.clusters:
            self.clusters.move_to_end(key)
            return self.clusters[key]
        evictable = [k for k in self.clusters if k not in self.pinned]
        while evictable and len(self.clusters) >= MAX_ALIVE:
            self.clusters.pop(evictable.pop(0)).close()
        cluster = Cluster(Topology.parse(topology), backend=backend, deadline=self.deadline).start()
        self.clusters[key] = cluster
        return cluster

    def close(self) -> None:
        while self.clusters:
            self.clusters.popitem()[1].close()


@pytest.fixture(scope="session")
def meshsim_pool(request: Any) -> Any:
    pool = ClusterPool(request.config.getoption("--meshsim-deadline"))
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def meshsim_cluster(request: Any, meshsim_pool: ClusterPool) -> Any:
    return meshsim_pool.get(request.config.getoption("--meshsim-topology"),
                            request.config.getoption("--meshsim-backend"), pin=True)


class Helper:
    """What a test needs to drive a cluster."""

    def __init__(self, cluster: Any, deadline: float | None):
        self.cluster = cluster
        self.deadline = deadline

    def run(self, plan: Any, deadline: float | None = None) -> Any:
        return self.cluster.run(plan, deadline=deadline or self.deadline)

    def assert_agrees(self, plan: Any, deadline: float | None = None, strict: bool = False) -> Any:
        from .sweep.properties import assert_agrees

        return assert_agrees(self.cluster, plan, deadline=deadline or self.deadline, strict=strict)

    def check_property(self, strategy: Any = None, max_examples: int = 50, **kwargs: Any) -> None:
        from .sweep.properties import check_property

        check_property(self.cluster, strategy, max_examples=max_examples, deadline=self.deadline, **kwargs)

    def run_fn(self, fn: Callable, *args: Any, deadline: float | None = None, check: bool = True,
               **kwargs: Any) -> Any:
        """fn on every rank; with check=True (the default) a run that does not pass fails the test with the whole
        report, whether or not the test reads the values."""
        result = self.cluster.run_fn(fn, *args, deadline=deadline or self.deadline, **kwargs)
        return result.raise_for_outcome() if check else result

    def launch(self, script: str, args: list[str] | tuple = (), deadline: float | None = None,
               module: bool = False, check: bool = True, **options: Any) -> Any:
        """Your own torchrun script on this test's topology (simulated GPUs when the machine has too few); with
        check=True a failed or hung launch fails the test with the whole report (tracebacks, diagnosis, groups).
        options: torchrun's, as meshsim.launch takes them (max_restarts, host_dirs, ...)."""
        from .core.deadlines import LAUNCH_S
        from .launch.launcher import launch

        result = launch(script, self.cluster.topology, args, deadline=deadline or self.deadline or LAUNCH_S,
                        module=module, **options)
        return result.raise_for_outcome() if check else result


@pytest.fixture
def meshsim(request: Any, meshsim_pool: ClusterPool) -> Helper:
    marker = request.node.get_closest_marker("meshsim")
    options = dict(marker.kwargs) if marker else {}
    topology = options.get("topology", request.config.getoption("--meshsim-topology"))
    backend = options.get("backend", request.config.getoption("--meshsim-backend"))
    return Helper(meshsim_pool.get(topology, backend), options.get("deadline"))
