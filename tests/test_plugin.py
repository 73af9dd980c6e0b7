"""The pytest plugin: fixtures, marker, helpers; xdist workers each get their own cluster, nothing leaks."""

import time

from helpers import alive

PLUGIN_TESTS = '''
import os
import pytest
from meshsim import Plan, step
from meshsim.sweep.strategies import plans

PLAN = Plan((step("init_device_mesh", shape=[2], names=["x"], out="m"), step("check", mesh="m")))

def record(cluster):
    with open(os.environ["PIDS_FILE"], "a") as fh:
        fh.write(" ".join(map(str, cluster.pids)) + "\\n")

def test_session_cluster_runs_a_plan(meshsim_cluster):
    record(meshsim_cluster)
    assert meshsim_cluster.topology.world == 2
    assert meshsim_cluster.run(PLAN).passed

@pytest.mark.meshsim(topology="2x2")
def test_marker_picks_the_topology(meshsim):
    record(meshsim.cluster)
    assert meshsim.cluster.world == 4
    meshsim.assert_agrees(Plan((step("init_device_mesh", shape=[2, 2], names=["a", "b"], out="m"),
                                step("check", mesh="m"))))

def test_property_helper(meshsim):
    meshsim.check_property(plans(2), max_examples=5)

def test_run_fn_helper(meshsim):
    assert meshsim.run_fn(lambda: int(os.environ["LOCAL_RANK"])).values == [0, 1]

def test_a_run_fn_that_raises_fails_the_test_even_if_no_value_is_read(meshsim):
    from meshsim.judge.verdict import Failed
    with pytest.raises(Failed, match="ZeroDivisionError"):
        meshsim.run_fn(lambda: 1 / 0)
    assert meshsim.run_fn(lambda: 1 / 0, check=False).outcome == "error"

def test_a_strict_run_fails_on_a_finding_and_shows_the_report(meshsim):
    from meshsim.sweep.properties import Disagreement
    reversed_mesh = Plan((step("mesh", layout=[1, 0], names=["x"], out="m"), step("check", mesh="m")))
    meshsim.assert_agrees(reversed_mesh)
    with pytest.raises(Disagreement, match="group-rank-order"):
        meshsim.assert_agrees(reversed_mesh, strict=True)
'''


def test_plugin_under_xdist_gives_each_worker_a_cluster_and_leaves_no_process(pytester, tmp_path, monkeypatch):
    pids_file = tmp_path / "pids"
    monkeypatch.setenv("PIDS_FILE", str(pids_file))
    pytester.makepyfile(test_inner=PLUGIN_TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "--meshsim-topology", "1x2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
    pids = [int(p) for line in pids_file.read_text().split("\n") for p in line.split()]
    assert len(pids) >= 4
    deadline = time.monotonic() + 120  # a bound on the wait: the ranks end as the session does
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
