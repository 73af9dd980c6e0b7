"""The engine on real ranks: a simulated 2x4 cluster of gloo workers, shared by the whole session."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import alive

from meshsim import Cluster, ClusterError, Plan, Topology, step
from meshsim.sweep.properties import assert_agrees

S = step
M2 = S("init_device_mesh", shape=[2, 4], names=["dp", "tp"], out="m")
M3 = S("init_device_mesh", shape=[2, 2, 2], names=["dp", "cp", "tp"], out="m")

EVERY_OPERATION = {
    "init 1-D to 5-D, size-1 dims": [S("init_device_mesh", shape=[2, 1, 2, 1, 2], names=list("abcde"), out="m"),
                                     S("check", mesh="m"), S("init_device_mesh", shape=[8], out="w"),
                                     S("check", mesh="w")],
    "unnamed mesh": [S("init_device_mesh", shape=[2, 4], out="m"), S("check", mesh="m"),
                     S("slice", src="m", names="x", out="s"), S("flatten", src="m", out="f")],
    "mesh smaller than the world": [S("init_device_mesh", shape=[3], names=["x"], out="m"), S("check", mesh="m")],
    "explicit permutation": [S("mesh", layout=[[7, 6, 5, 4], [3, 2, 1, 0]], names=["dp", "tp"], out="m"),
                             S("check", mesh="m"), S("slice", src="m", names="tp", out="t"), S("check", mesh="t")],
    "explicit subset, sliced": [S("mesh", layout=[[0, 1], [2, 3]], names=["a", "b"], out="m"), S("check", mesh="m"),
                                S("slice", src="m", names="b", out="t")],
    "irregular rank map": [S("mesh", layout=[[0, 1, 2, 5], [4, 3, 6, 7]], names=["dp", "tp"], out="m"),
                           S("check", mesh="m")],
    "slicing: one, several, nested, illegal": [
        M3, S("slice", src="m", names=["dp", "tp"], out="a"), S("check", mesh="a"),
        S("slice", src="a", names="tp", out="b"), S("check", mesh="b"),
        S("slice", src="m", names=["cp", "dp"], out="c"), S("slice", src="m", names=["dp", "dp"], out="d"),
        S("slice", src="m", names=["zz"], out="e"), S("slice", src="a", names=["dp", "tp"], out="f")],
    "size-1 dim skips the order check": [S("init_device_mesh", shape=[2, 1, 4], names=["p", "q", "r"], out="m"),
                                         S("slice", src="m", names=["r", "q"], out="s"), S("check", mesh="s")],
    "flatten: default, named, repeated, clash, sliced from root": [
        M3, S("slice", src="m", names=["dp", "cp"], out="a"), S("flatten", src="a", out="f"), S("check", mesh="f"),
        S("flatten", src="a", out="f2"), S("flatten", src="a", name="dp", out="f3"),
        S("slice", src="m", names=["dp", "tp"], out="b"), S("flatten", src="b", name="dp_cp", out="f4"),
        S("slice", src="m", names="dp_cp", out="g"), S("check", mesh="g"), S("flatten", src="b", out="h"),
        S("check", mesh="h"), S("slice", src="a", names="dp_cp", out="j")],
    "unflatten": [S("init_device_mesh", shape=[8], names=["w"], out="m"),
                  S("unflatten", src="m", dim=0, sizes=[2, 4], names=["a", "b"], out="u"), S("check", mesh="u"),
                  S("unflatten", src="u", dim="b", sizes=[2, 2], names=["c", "d"], out="v"), S("check", mesh="v"),
                  S("unflatten", src="u", dim=5, sizes=[2, 2], names=["c", "d"], out="x1"),
                  S("unflatten", src="u", dim="b", sizes=[2, 3], names=["c", "d"], out="x2"),
                  S("unflatten", src="u", dim="b", sizes=[2, 2], names=["a", "d"], out="x4"), S("check", mesh="x4")],
    "concatenate": [M3, S("slice", src="m", names="dp", out="a"), S("slice", src="m", names="tp", out="b"),
                    S("concatenate", srcs=["a", "b"], out="c"), S("check", mesh="c"),
                    S("concatenate", srcs=["b", "a"], out="d"), S("check", mesh="d"),
                    S("concatenate", srcs=["a", "a"], out="e"),
                    S("init_device_mesh", shape=[8], names=["w"], out="n"), S("concatenate", srcs=["a", "n"], out="f")],
    "from_group 1-D and N-D": [M2, S("from_group", src="m", dims=["tp"], out="a"), S("check", mesh="a"),
                               S("from_group", src="m", out="b"), S("check", mesh="b"),
                               S("from_group", src="m", dims=["tp", "dp"], out="c"), S("check", mesh="c"),
                               S("new_group", ranks=[1, 3, 5], out="g"),
                               S("from_group", group="g", names=["x"], out="d"), S("check", mesh="d")],
    "all_submeshes": [M2, S("all_submeshes", src="m", dim="tp", out="s"), S("check", mesh="s.0"),
                      S("check", mesh="s.1"), S("all_submeshes", src="m", dim="zz", out="t")],
    "every query": [M2] + [S("query", mesh="m", what=w) for w in
                           ("get_all_groups", "get_coordinate", "shape", "ndim", "mesh", "mesh_dim_names", "size")]
                   + [S("query", mesh="m", what=w, dim=d) for w in ("get_group", "get_local_rank", "size")
                      for d in (0, 1, "dp", "tp", None, 5, "zz")],
    "collectives on mesh dims and groups": [
        M2, S("all_reduce", mesh="m", dim="tp"), S("all_gather", mesh="m", dim=0),
        S("broadcast", mesh="m", dim="tp", src=2), S("barrier", mesh="m", dim="dp"),
        S("new_group", ranks=[0, 7], out="g"), S("all_reduce", group="g"), S("all_gather", group="g")],
    "errors torch must raise": [
        S("init_device_mesh", shape=[3, 3], names=["a", "b"], out="m", expect_error=True),
        S("init_device_mesh", shape=[2, 4], names=["a", "a"], out="k"),
        S("init_device_mesh", shape=[2, 4], names=["a"], out="j")],
}


@pytest.mark.parametrize("name", list(EVERY_OPERATION))
def test_every_mesh_operation_agrees_with_the_model_on_real_ranks(meshsim_cluster, name):
    assert_agrees(meshsim_cluster, Plan(tuple(EVERY_OPERATION[name])))


def test_non_monotonic_layout_is_reported_as_a_finding_not_a_failure(meshsim_cluster):
    result = assert_agrees(meshsim_cluster, Plan(tuple(EVERY_OPERATION["explicit permutation"])))
    assert "group-rank-order" in result.findings
    strict = meshsim_cluster.run(Plan(tuple(EVERY_OPERATION["explicit permutation"])))
    strict.strict = True
    assert not strict.passed


def test_workers_get_torchruns_environment_for_their_simulated_host(meshsim_cluster):
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    envs = meshsim_cluster.run_fn(lambda: {k: os.environ[k] for k in keys}).values
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["LOCAL_RANK"] == str(rank % 4) and env["GROUP_RANK"] == str(rank // 4)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "8"
        assert env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(meshsim_cluster.port)


def test_torch_subgroup_waits_are_bounded_by_the_deadline(meshsim_cluster):
    def timeouts():
        import torch.distributed.distributed_c10d as c10d
        return c10d.default_pg_timeout.total_seconds()

    (seconds,) = set(meshsim_cluster.run_fn(timeouts, deadline=7).values)
    assert 7 < seconds < 60  # not torch's 30 minutes


def test_groups_a_plan_made_are_destroyed_before_the_next(meshsim_cluster):
    def live_groups():
        import torch.distributed.distributed_c10d as c10d
        return len(c10d._world.pg_map)

    before = meshsim_cluster.run_fn(live_groups).values
    assert_agrees(meshsim_cluster, Plan((M3, S("slice", src="m", names=["dp", "cp"], out="s"),
                                         S("flatten", src="s", out="f"), S("check", mesh="f"))))
    assert meshsim_cluster.run_fn(live_groups).values == before


def test_a_rank_building_another_shape_ends_as_a_bounded_hang_naming_it(meshsim_cluster):
    plan = Plan((S("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m", on_rank={3: {"shape": [4, 2]}}),
                 S("check", mesh="m")))
    result = meshsim_cluster.run(plan, deadline=3)
    # bounded: by the deadline, or sooner, once the stuck ranks have gone still (the model predicted the hang)
    assert result.record.stopped in ("still", "deadline") and result.record.deadline == 3
    assert result.record.elapsed < 3 + 1 if result.record.stopped == "still" else True
    assert result.outcome == "hang" and result.passed
    assert result.diagnosis.kind == "inconsistent mesh across ranks" and result.culprits == [3]
    assert_agrees(meshsim_cluster, Plan((M2, S("check", mesh="m"))))  # fresh workers serve the next plan


def test_a_plan_still_progressing_at_its_deadline_is_too_slow_not_a_hang_and_names_no_culprit(meshsim_cluster):
    from meshsim.core.outcome import KINDS

    steps = [M2]
    for _ in range(1500):  # at a few hundred steps a second, far more than 2 s allow
        steps += [S("all_reduce", mesh="m", dim="tp"), S("barrier", mesh="m", dim="dp")]
    result = meshsim_cluster.run(Plan(tuple(steps)), deadline=2)
    d = result.diagnosis
    assert result.outcome == "slow" and not result.passed and d is not None, result.report()
    assert (d.kind, d.culprits, d.waits) == (KINDS["slow"], [], []), d.summary
    assert [p.rank for p in d.paces] == list(range(8)) and all(p.rate and p.moving for p in d.paces)
    reached = [result.record.states[r].step for r in range(8)]
    assert d.suggested_deadline > 2 * len(steps) / max(reached) and f"{d.suggested_deadline:g} s" in d.summary


def test_a_skipped_subgroup_all_reduce_names_rank_collective_group_and_dim(meshsim_cluster):
    plan = Plan((M2, S("all_reduce", mesh="m", dim="tp", skip_on=[5]), S("check", mesh="m")))
    result = meshsim_cluster.run(plan, deadline=3)
    assert result.outcome == "hang" and result.culprits == [5]
    waits = {w.rank: w for w in result.diagnosis.waits}
    assert waits[4].call == "all_reduce" and waits[4].group_ranks == [4, 5, 6, 7]
    assert waits[4].mesh == "m" and waits[4].mesh_dim == "tp" and waits[4].group_coordinate == [1, "*"]
    assert result.diagnosis.stacks and "all_reduce" in result.diagnosis.stacks[0][1]


def test_a_rank_that_dies_ends_the_run_as_a_crash_well_before_the_deadline(meshsim_cluster):
    plan = Plan((M2, S("kill", only_on=[2]), S("check", mesh="m")))
    result = meshsim_cluster.run(plan, deadline=60)
    assert result.record.stopped == "failure"  # a grace after the death, not the deadline
    assert result.outcome == "crash" and result.passed and result.culprits == [2]


def test_a_user_function_that_hangs_is_diagnosed_with_its_mesh_dim(meshsim_cluster):
    def skip_on_six():
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        if dist.get_rank() != 6:
            dist.all_reduce(torch.ones(1), group=mesh.get_group("tp"))

    run = meshsim_cluster.run_fn(skip_on_six, deadline=4)  # room for the mesh on a loaded CI machine
    assert run.outcome == "hang" and run.diagnosis.culprits == [6], run.report()
    assert {w.mesh_dim for w in run.diagnosis.waits} == {"tp"}


def test_the_diagnosis_headline_names_the_group_the_culprit_is_missing_from_not_a_side_effect(meshsim_cluster):
    def skip_on_five():
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        if dist.get_rank() != 5:
            dist.all_reduce(torch.ones(1), group=mesh.get_group("tp"))
        dist.all_reduce(torch.ones(1), group=mesh.get_group("dp"))

    run = meshsim_cluster.run_fn(skip_on_five, deadline=5)  # room for the mesh on a loaded CI machine
    assert run.diagnosis.culprits == [5], run.diagnosis.summary
    headline = run.diagnosis.summary
    assert "on group [4, 5, 6, 7]" in headline and "dim 'tp'" in headline and "missing: 5" in headline, headline


def test_closures_run_on_every_rank_and_exceptions_come_back(meshsim_cluster):
    offset = 100
    assert meshsim_cluster.run_fn(lambda: __import__("torch").distributed.get_rank() + offset).values == \
        list(range(100, 108))

    def fails_on_three():
        import torch.distributed as dist
        if dist.get_rank() == 3:
            raise ValueError("rank three")

    run = meshsim_cluster.run_fn(fails_on_three)
    assert run.outcome == "error" and run.failed_ranks == [3]
    assert isinstance(run.results[3].error, ValueError)


def _listening_sockets(pids):
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:
                    found.append(parts[1])
    return found


def test_nothing_listens_beyond_loopback(meshsim_cluster):
    listening = _listening_sockets(meshsim_cluster.pids + [os.getpid()])
    assert listening
    for address in listening:
        host = address.split(":")[0]
        assert host in ("0100007F", "00000000000000000000000001000000"), address


@pytest.mark.meshsim(topology="2x6")
def test_unflatten_across_flattened_dims_raises_a_bare_assertion(meshsim):
    plan = Plan((S("init_device_mesh", shape=[2, 2, 3], names=["a", "b", "c"], out="m"),
                 S("slice", src="m", names=["a", "c"], out="s"), S("flatten", src="s", out="f"),
                 S("unflatten", src="f", dim=0, sizes=[3, 2], names=["x", "y"], out="u"),
                 S("unflatten", src="f", dim=0, sizes=[2, 3], names=["x", "y"], out="v"), S("check", mesh="v")))
    result = meshsim.assert_agrees(plan)
    assert "unflatten-bare-assertion" in result.findings


def test_two_clusters_at_once_do_not_collide(meshsim_cluster):
    with Cluster(Topology(1, 2), deadline=10) as other:
        assert other.port != meshsim_cluster.port
        assert_agrees(other, Plan((S("init_device_mesh", shape=[2], names=["x"], out="m"), S("check", mesh="m"))))
        assert_agrees(meshsim_cluster, Plan((M2, S("check", mesh="m"))))


def test_asking_for_nccl_without_gpus_is_a_clear_error():
    with pytest.raises(ClusterError, match="one rank per GPU"):
        Cluster(Topology(2, 4), backend="nccl")


def test_no_worker_outlives_a_controller_killed_with_sigkill(tmp_path):
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from meshsim import Topology
        from meshsim import Cluster
        if __name__ == "__main__":
            cluster = Cluster(Topology(1, 2), deadline=10).start()
            print(" ".join(map(str, cluster.pids)), flush=True)
            time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 120  # a bound on the wait, not a timing claim: the kernel kills them at once
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids)
    finally:
        proc.kill()



LOCAL_TENSOR_MODE = """
import json, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
with LocalTensorMode(8):
    mesh = DeviceMesh("cpu", [[0, 1, 2, 5], [4, 3, 6, 7]], mesh_dim_names=("dp", "tp"))
    print(json.dumps({str(r): v for r, v in mesh.get_local_rank("tp").node._local_ints.items()}))
"""


def test_local_tensor_mode_is_not_an_oracle_for_irregular_rank_maps(meshsim_cluster):
    """The registry's localtensormode-not-an-oracle finding, measured: it disagrees with real ranks."""
    import json

    out = subprocess.run([sys.executable, "-c", LOCAL_TENSOR_MODE], capture_output=True, text=True, timeout=120)
    simulated = {int(r): v for r, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    plan = Plan((S("mesh", layout=[[0, 1, 2, 5], [4, 3, 6, 7]], names=["dp", "tp"], out="m"),
                 S("query", mesh="m", what="get_local_rank", dim="tp")))
    real = {s.rank: s.observations[1] for s in meshsim_cluster.run(plan).record.states}
    assert real[3] == 0 and simulated[3] == 1
    assert real != simulated


def test_a_rank_aborted_by_cpp_is_reported_with_its_last_words(meshsim_cluster):
    plan = Plan((M2, S("all_reduce", mesh="m", dim="tp", on_rank={2: {"numel": 16}})))
    result = meshsim_cluster.run(plan, deadline=5)
    assert result.outcome == "crash" and result.passed  # a known finding: gloo does not refuse the sizes
    assert "gloo-size-mismatch-silent" in result.findings
    dead = [where for where in result.diagnosis.elsewhere.values() if "died" in where]
    assert dead and any("doesn't match expected size" in where for where in dead)


def test_a_worker_killed_between_plans_is_replaced_before_the_next(meshsim_cluster):
    victim = meshsim_cluster.pids[3]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while alive(victim) and time.monotonic() < deadline:
        time.sleep(0.05)
    result = assert_agrees(meshsim_cluster, Plan((M2, S("check", mesh="m"))))
    assert result.outcome == "pass" and victim not in meshsim_cluster.pids


def test_a_plans_progress_is_held_and_sent_with_its_result_or_as_soon_as_a_rank_waits():
    # 30-odd events a plan, one pipe message each, cost more than the plan's collectives: a worker holds them
    from meshsim.compat.progress import Progress
    from meshsim.core.wire import Batch, CallBegun, StepBegun

    sent = []
    progress = Progress(sent.append, hold_s=0.05)
    progress.in_plan = True
    progress.emit(StepBegun(0, "check", None, 0.0))
    progress.call("all_reduce", (0, 1), "1")
    assert sent == []
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:  # the rank now waits in its all_reduce: it must be heard
        time.sleep(0.01)
    assert len(sent) == 1 and [type(e) for e in sent[0].events] == [StepBegun, CallBegun]
    progress.returned()
    progress.emit(StepBegun(1, "to_local", None, 0.0))
    progress.end_plan()
    progress.send_result("done")  # what is still held goes first, in one message with the result
    assert len(sent) == 2 and sent[1].events[-1] == "done" and isinstance(sent[1].events[0], Batch)

def test_a_launched_scripts_call_is_said_at_once_and_its_return_rides_with_the_next_call_or_is_heard_soon():
    # a DDP step's begun / returned / done were three pipe messages a rank; a call must still go out before it
    # runs (gloo aborts the process on tensors of another size, and the judge needs that call's sizes)
    from meshsim.compat.progress import Progress
    from meshsim.core.wire import Batch, CallBegun, CallReturned

    sent = []
    progress = Progress(sent.append, hold_s=0.05, hold_scripts=True)
    key = progress.call("all_reduce", (0, 1), "1")
    assert len(sent) == 1 and isinstance(sent[0], CallBegun)
    progress.returned()
    progress.call("all_reduce", (0, 1), "1")
    assert len(sent) == 2 and [type(e) for e in sent[1].events] == [CallReturned, CallBegun]
    progress.returned_handle(key, object())
    progress.completed(key)
    deadline = time.monotonic() + 5
    while len(sent) == 2 and time.monotonic() < deadline:  # the script now computes, or waits: it must be heard
        time.sleep(0.01)
    assert len(sent) == 3 and isinstance(sent[2], Batch) and len(sent[2].events) == 2



def test_a_group_creation_is_sent_at_once_unless_the_transports_send_before_connecting():
    # gloo's connect holds the GIL: a rank stuck in it could not send what it held
    from meshsim.compat.progress import Progress

    sent = []
    progress = Progress(sent.append, hold_s=60)
    progress.in_plan = True
    progress.creating((0, 1), "3", None)
    assert len(sent) == 1 and sent[0].kind == "new_group"
    progress.hold_creations = True
    progress.creating((0, 1), "4", None)
    assert len(sent) == 1
    progress.flush()
    assert len(sent) == 2


def test_a_rank_that_exits_mid_plan_is_placed_at_the_step_it_died_in(meshsim_cluster):
    plan = Plan((M2, S("check", mesh="m"), S("exit", only_on=[3]), S("check", mesh="m")))
    result = meshsim_cluster.run(plan, deadline=60)
    assert result.outcome == "crash" and result.culprits == [3]
    assert result.record.states[3].step == 2  # its held progress went out before the process ended


def test_a_failure_of_the_culprit_rule_itself_is_a_diagnosis_without_culprits_not_a_traceback(meshsim_cluster,
                                                                                              monkeypatch):
    import meshsim.judge.diagnose as diagnose

    def broken(*args, **kwargs):
        raise IndexError("list index out of range")

    monkeypatch.setattr(diagnose, "blame", broken)
    plan = Plan((M2, S("all_reduce", mesh="m", dim="tp", skip_on=[5]), S("check", mesh="m")))
    result = meshsim_cluster.run(plan, deadline=3)
    assert result.outcome == "hang" and result.culprits == []
    assert "culprit rule failed on this record (IndexError: list index out of range)" in result.diagnosis.summary
    assert {4, 6, 7} <= {w.rank for w in result.diagnosis.waits}  # the waits are still reported
