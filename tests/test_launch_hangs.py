"""A hung script under `meshsim launch`: the rank that caused it is named, its partners are not, and the hang is
left behind as evidence (Flight Recorder dumps in torch's format, a picture) for torch's analyzer and replay."""

import os
import signal
import subprocess
import sys

from helpers import kill_session, wait_for

from meshsim import Topology
from meshsim.launch.launcher import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "launch_scripts")


def test_a_rank_that_skips_inside_a_loop_is_the_only_culprit_and_its_partner_a_victim_of_a_mismatched_collective():
    result = launch(os.path.join(SCRIPTS, "skip_in_loop.py"), Topology(1, 2), deadline=3)
    assert result.outcome == "hang" and result.diagnosis.culprits == [1], result.report()
    assert result.diagnosis.kind == "skipped collective"
    assert "skip_in_loop.py:11" in result.diagnosis.summary  # the call it skipped, by its line
    assert "mismatched collective" in result.diagnosis.victims[0]
    assert "rank 0, not to blame" in result.report()


def test_the_same_hang_names_the_same_culprits_on_every_run():
    runs = [launch(os.path.join(SCRIPTS, "skip_in_loop.py"), Topology(1, 2), deadline=3) for _ in range(2)]
    assert [r.diagnosis.culprits for r in runs] == [[1], [1]]
    assert runs[0].diagnosis.summary == runs[1].diagnosis.summary


def test_a_rank_that_returns_early_is_the_culprit_and_the_ranks_waiting_for_it_are_not():
    result = launch(os.path.join(SCRIPTS, "exits_early.py"), Topology(1, 4), deadline=3)
    assert result.outcome == "hang" and result.diagnosis.culprits == [3], result.report()
    assert result.diagnosis.kind == "rank left early" and result.exit_codes[3] == 0


def test_a_hang_leaves_flight_recorder_dumps_that_replay_names_as_launch_did_and_torchs_analyzer_reads(tmp_path):
    from meshsim.replay import analyze, build, read_dir
    from meshsim.replay.torch_analyzer import run_torch

    result = launch(os.path.join(SCRIPTS, "skip_collective.py"), Topology(2, 4), deadline=3, log_dir=str(tmp_path))
    assert result.diagnosis.culprits == [5]
    dumps = read_dir(str(tmp_path / "flight_recorder"))
    assert sorted(d.rank for d in dumps.dumps) == list(range(8))
    incident = build(dumps)
    assert analyze(incident).culprits == [5]  # the round trip: the dumps tell the same story
    torch_answer = run_torch(dumps, incident)
    waited_for = {m for w in result.diagnosis.waits for m in w.missing}
    assert torch_answer.available and set(torch_answer.missing) == waited_for == {4, 5, 6, 7}


def test_a_hang_leaves_its_picture_in_the_log_dir(tmp_path):
    launch(os.path.join(SCRIPTS, "skip_in_loop.py"), Topology(1, 2), deadline=3, log_dir=str(tmp_path))
    svg, html = (tmp_path / "hang.svg").read_text(), (tmp_path / "hang.html").read_text()
    assert "<svg" in svg and "host" in html and "skipped collective" in html and "culprit ranks" in html


# rank 1 lingers a second before it says it finished: rank 0 has by then long entered the call it waits in
LEAVES_EARLY = """
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(2))
else:
    time.sleep(1)
print("finished", dist.get_rank(), flush=True)
"""


def test_ctrl_c_on_a_hung_launch_prints_the_diagnosis_and_exits_130(tmp_path):
    script = tmp_path / "leaves_early.py"
    script.write_text(LEAVES_EARLY)
    proc = subprocess.Popen([sys.executable, "-m", "meshsim", "launch", "--nproc-per-node", "2", "--deadline", "600",
                             "--log-dir", str(tmp_path), str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        log = tmp_path / "rank1.log"
        # rank 1 prints "finished" past the call it skipped: the hang is in place (rank 0 waits in it)
        wait_for(lambda: "finished" in (log.read_text() if log.exists() else ""), what="rank 1 to leave")
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        kill_session(proc)  # whatever happened, no rank of the launch outlives the test
    assert proc.returncode == 130, err
    assert "Diagnosis:" in err and "culprit ranks 1" in err and "interrupted" in err, err
