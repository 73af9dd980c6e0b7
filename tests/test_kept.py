"""What keeps a sweep fast without changing what it checks: ranks that have all gone still are stuck before the
deadline (meshsim.run.still), and gloo's transports kept from one plan to the next (meshsim.run.transports)."""

import subprocess
import sys
import textwrap
import time

import pytest

from meshsim import Plan, step
from meshsim.core.record import RankState
from meshsim.run.still import Stillness, available
from meshsim.run.transports import Keeper
from meshsim.sweep.properties import assert_agrees

S = step
M2 = S("init_device_mesh", shape=[2, 4], names=["dp", "tp"], out="m")
pytestmark = pytest.mark.skipif(not available(), reason="threads' states and run times come from Linux's /proc")


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True)


def _still_within(pids: list[int], seconds: float) -> bool:
    stillness, end = Stillness(), time.monotonic() + seconds
    while time.monotonic() < end:
        if stillness.look(pids):
            return True
        time.sleep(0.05)
    return False


def _goes_still_once_ready(child) -> bool:
    """Whether `child`, once it says it is ready, is seen still within a minute; it is killed either way."""
    try:
        assert child.stdout.readline().strip() == "ready"
        return _still_within([child.pid], 60)
    finally:
        child.kill()
        child.wait()


def test_a_process_that_waits_for_nothing_that_will_come_is_still():
    child = _child("import os, sys; r, w = os.pipe(); print('ready', flush=True); os.read(r, 1)")
    assert _goes_still_once_ready(child)


def test_a_process_that_computes_or_sleeps_in_steps_is_never_still():
    busy = _child("print('ready', flush=True)\nwhile True: pass")
    stepping = _child("""
        import time
        print('ready', flush=True)
        while True:
            time.sleep(0.02)  # wakes and runs, like a rank between the parts of its work
            sum(range(20000))
    """)
    try:
        for child in (busy, stepping):
            assert child.stdout.readline().strip() == "ready"
            assert not _still_within([child.pid], 1.5)
    finally:
        for child in (busy, stepping):
            child.kill()
            child.wait()


def test_a_socket_loop_that_only_ticks_does_not_keep_a_process_moving():
    # gloo's socket loops wake every 10 ms to check whether they should end: a stuck rank has a few
    child = _child("""
        import ctypes, os, threading, time
        def loop():
            ctypes.CDLL("libc.so.6").prctl(15, b"gloo_tcp_loop")
            while True:
                time.sleep(0.01)
        threading.Thread(target=loop, daemon=True).start()
        r, w = os.pipe()
        print('ready', flush=True)
        os.read(r, 1)
    """)
    assert _goes_still_once_ready(child)


def test_a_hang_the_model_predicts_ends_once_the_ranks_are_still_not_at_the_deadline(meshsim_cluster):
    plan = Plan((M2, S("all_reduce", mesh="m", dim="tp", skip_on=[5]), S("check", mesh="m")))
    result = meshsim_cluster.run(plan, deadline=60)
    assert result.outcome == "hang" and result.passed and result.culprits == [5]
    assert result.record.stopped == "still" and result.record.elapsed < 30
    assert_agrees(meshsim_cluster, Plan((M2, S("check", mesh="m"))))  # the spare generation serves the next plan


def _kept():
    from meshsim.run import transports

    found = transports._active
    return sorted((list(key[0]), id(backend)) for key, backend in found.kept.items()) if found else None


def test_groups_of_the_same_members_reuse_the_transport_a_previous_plan_connected(meshsim_cluster):
    assert_agrees(meshsim_cluster, Plan((M2, S("check", mesh="m"))))
    first = meshsim_cluster.run_fn(_kept).values
    assert [ranks for ranks, _ in first[5]] == [[1, 5], [4, 5, 6, 7]]
    assert_agrees(meshsim_cluster, Plan((M2, S("all_reduce", mesh="m", dim="dp"), S("check", mesh="m"))))
    assert meshsim_cluster.run_fn(_kept).values == first  # the same backends, in step on every member


def test_a_rank_that_does_not_make_a_kept_group_leaves_its_members_waiting_in_new_group(meshsim_cluster):
    assert_agrees(meshsim_cluster, Plan((M2, S("check", mesh="m"))))
    plan = Plan((S("init_device_mesh", shape=[2, 4], names=["dp", "tp"], out="m", skip_on=[6]),
                 S("check", mesh="m")))
    result = meshsim_cluster.run(plan, deadline=20)
    assert result.outcome == "hang" and result.passed and result.culprits == [6]
    # 6's peers wait to make their groups with it, and the others to make theirs with those (as without kept
    # transports: each new gloo group waits for all its members)
    assert {w.call for w in result.diagnosis.waits} == {"new_group"}
    assert {w.rank for w in result.diagnosis.waits} == {0, 1, 2, 3, 4, 5, 7}


def _state(rank: int, transports: dict, end: str = "finished", in_flight: bool = False) -> RankState:
    state = RankState(rank, end=end, transports=tuple(transports.items()))
    if in_flight:
        state.in_flight[("1", 0)] = None
    return state


def test_transports_stay_only_while_every_member_counts_the_same_collectives_on_them():
    a, b = ((0, 1), 60.0), ((2, 3), 60.0)
    states = [_state(0, {a: 3}), _state(1, {a: 3}), _state(2, {b: 1}), _state(3, {b: 1})]
    assert Keeper(1).after(states) == ()
    states[3] = _state(3, {b: 2})  # rank 3 ran one more collective on [2, 3]: out of step
    assert Keeper(1).after(states) is None
    states[3] = _state(3, {b: 1}, in_flight=True)  # a collective still in flight
    assert Keeper(1).after(states) is None
    states[3] = _state(3, {b: 1}, end="raised")
    assert Keeper(1).after(states) is None


def test_a_rank_keeps_at_most_so_many_transports_and_forgets_the_least_recently_used():
    keeper = Keeper(1, at_most=2)
    keys = [((0, 1), 60.0), ((0, 2), 60.0), ((0, 3), 60.0)]
    for key in keys:
        others = [_state(r, {key: 1} if r in key[0] else {}) for r in range(1, 4)]
        forgot = keeper.after([_state(0, {key: 1})] + others)
    assert forgot == (keys[0],)
    assert sorted(keeper.used) == keys[1:]


def test_a_rank_keeps_no_more_sockets_to_other_members_than_its_budget(monkeypatch):
    import meshsim.run.transports as transports

    monkeypatch.setattr(transports, "PEERS_AT_MOST", 4)  # (256 in use: a 1024-file limit holds a 16-rank world's)
    keeper = Keeper(1)
    keys = [((0, 1, 2), 60.0), ((0, 2, 3), 60.0), ((0, 1, 3), 60.0)]  # two sockets each for rank 0
    for key in keys:
        others = [_state(r, {key: 1} if r in key[0] else {}) for r in range(1, 4)]
        forgot = keeper.after([_state(0, {key: 1})] + others)
    assert forgot == (keys[0],)
    assert sorted(keeper.used) == sorted(keys[1:])
