"""`meshsim launch` speaks torchrun: its flag forms with their meaning, restarts, log routing, and the hosts a
script runs on (their names, disks and threads), as on a real cluster."""

import os
import re
import subprocess
import sys

import pytest

from meshsim import Topology
from meshsim.cli import build_parser, main
from meshsim.launch.launcher import launch
from meshsim.launch.options import GPUS_PER_HOST, LaunchOptions, request_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "launch_scripts")


def mapped(*argv):
    return request_of(build_parser().parse_args(["launch", *argv, "train.py", "--lr", "1"]))


# --------------------------------------------------------------------------------------------- flags


@pytest.mark.parametrize("argv, hosts, ranks, options", [
    (["--nproc_per_node=gpu"], 1, GPUS_PER_HOST, {}),
    (["--nproc-per-node", "gpu", "--devices-per-host", "4", "--nnodes=2"], 2, 4, {}),
    (["--nproc-per-node=auto", "--devices-per-host=2"], 1, 2, {}),
    (["--nnodes=1:3", "--nproc-per-node", "2"], 3, 2, {}),
    (["--nproc_per_node=2", "--devices-per-host", "4"], 1, 2, {"gpus_per_host": 4}),
    (["--devices-per-host", "3", "--hosts", "2"], 2, 3, {}),
    ([], 1, 1, {}),
    (["--max_restarts=3", "--rdzv_conf=join_timeout=45,last_call_timeout=1", "--role", "trainer"], 1, 1,
     {"max_restarts": 3, "start_timeout": 45.0, "role": "trainer"}),
    (["-r", "3", "--tee=0:1,1:2", "--local_ranks_filter=0,1", "--duplicate-stdout-filters", "loss,,step"], 1, 1,
     {"redirects": "3", "tee": "0:1,1:2", "local_ranks_filter": (0, 1), "duplicate_stdout_filters": ("loss,step",)}),
    (["--nnodes", "2", "--rdzv-id", "job7", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400"], 2, 1,
     {"run_id": "job7"}),
    (["--virtual-local-rank", "--run-path", "--node_rank=0", "--master_port=1234", "--monitor-interval=1",
      "--start-method=fork", "--host-dirs", "disks"], 1, 1, {"virtual_local_rank": True, "host_dirs": "disks"}),
])
def test_torchruns_flag_forms_mean_what_they_mean_in_torchrun(argv, hosts, ranks, options):
    request = mapped(*argv)
    assert request.topology == Topology(hosts, ranks)
    assert request.target == "train.py" and request.args == ["--lr", "1"]
    for name, value in options.items():
        assert getattr(request.options, name) == value, name


def test_what_gpu_and_min_max_were_taken_to_mean_is_said_before_the_run():
    assert mapped("--nproc_per_node=gpu", "--nnodes=1:2").notes == (
        "--nnodes 1:2: 2 simulated hosts (every host joins, as at MAX)",
        f"--nproc-per-node gpu: {GPUS_PER_HOST} ranks a host, on hosts of {GPUS_PER_HOST} simulated GPUs "
        "(--devices-per-host D chooses)")
    assert mapped("--nproc-per-node", "4", "--nnodes", "2").notes == ()


def test_the_job_id_is_torchruns_a_fresh_one_on_one_node_or_with_standalone_else_rdzv_id():
    assert re.fullmatch(r"[0-9a-f-]{36}", mapped("--nproc-per-node", "2").options.run_id)
    assert re.fullmatch(r"[0-9a-f-]{36}", mapped("--nnodes", "2", "--standalone", "--rdzv-id", "x").options.run_id)
    assert mapped("--nnodes", "2").options.run_id == "none"
    assert mapped("--nnodes", "2", "--rdzv_id=100", "--rdzv_endpoint=localhost:29400").options.run_id == "100"


def test_nproc_per_node_cpu_is_this_machines_cpu_count_as_torchrun_counts_it():
    from torch.distributed.run import determine_local_world_size

    assert mapped("--nproc-per-node", "cpu").topology.devices_per_host == determine_local_world_size("cpu")


@pytest.mark.parametrize("argv, named", [
    (["--no-python"], "--no-python"),
    (["--nproc-per-node", "xpu"], "--nproc-per-node xpu"),
    (["--nproc-per-node", "0"], "--nproc-per-node"),
    (["--nnodes", "3:2"], "--nnodes 3:2"),
    (["--nnodes", "1:2:3"], "--nnodes 1:2:3"),
    (["--rdzv-conf", "join_timeout"], "--rdzv-conf"),
    (["--rdzv-conf", "join_timeout=soon"], "join_timeout"),
    (["--redirects", "7"], "--redirects 7"),
    (["--tee", "0:9"], "--tee 0:9"),
    (["--local-ranks-filter", "0,a"], "--local-ranks-filter"),
    (["--max-restarts", "-1"], "--max-restarts"),
    (["--max-restarts", "many"], "--max-restarts"),
    (["--logs-specs", "no_such_logs_specs"], "--logs-specs"),
    (["--devices-per-host", "0"], "--devices-per-host"),
])
def test_flags_meshsim_cannot_honour_are_refused_in_one_line_naming_the_flag_and_start_nothing(argv, named, capsys):
    try:
        code = main(["launch", *argv, os.path.join(SCRIPTS, "streams.py")])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and named in err, err
    assert "Traceback" not in err


def test_a_module_is_found_in_the_launch_directory_as_python_dash_m_finds_it(tmp_path, monkeypatch):
    (tmp_path / "trainer_here.py").write_text("import os\nprint('module on', os.environ['RANK'])\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    result = launch("trainer_here", Topology(1, 2), module=True, deadline=60)
    assert result.passed, result.report()
    assert [o.strip() for o in result.outputs] == ["module on 0", "module on 1"]


# --------------------------------------------------------------------------------------------- hosts


@pytest.fixture(scope="module")
def host_view(tmp_path_factory):
    """One launch on 2 hosts x 2, each host with its own disk; every rank prints what it sees."""
    disks = tmp_path_factory.mktemp("disks")
    result = launch(os.path.join(SCRIPTS, "host_view.py"), Topology(2, 2), host_dirs=str(disks), deadline=120)
    assert result.passed, result.report()
    return disks, [dict(part.split("=", 1) for part in out.split()[1:]) | {"who": out.split()[0]}
                   for out in result.outputs]


def test_each_simulated_host_reports_its_own_hostname_through_every_api_equal_within_a_host(host_view):
    _, seen = host_view
    assert [s["who"] for s in seen] == ["meshsim-host0:0", "meshsim-host0:1", "meshsim-host1:0", "meshsim-host1:1"]
    for s in seen:  # socket.gethostname, platform.node, os.uname, $HOSTNAME, socket.getfqdn: one name
        assert s["names"] == f"['{s['who'].split(':')[0]}']" and s["resolves"] == "127.0.0.1"


def test_each_host_has_its_own_disk_so_a_checkpoint_rank_0_wrote_is_missing_on_host_1(host_view):
    disks, seen = host_view
    assert [s["checkpoint"] for s in seen] == ["True", "True", "False", "False"]
    assert [s["cwd"] for s in seen] == [str(disks / f"host{r // 2}") for r in range(4)]
    assert [s["tmp"] for s in seen] == [str(disks / f"host{r // 2}" / "tmp") for r in range(4)]
    assert (disks / "host0" / "checkpoint.pt").exists() and not (disks / "host1" / "checkpoint.pt").exists()


def test_ranks_get_torchruns_thread_setting_one_thread_when_a_host_runs_several(host_view):
    _, seen = host_view
    assert {(s["threads"], s["omp"]) for s in seen} == {("1", "1")}


def test_an_omp_num_threads_the_user_set_reaches_the_ranks_as_under_torchrun(monkeypatch):
    from meshsim.launch.launcher import _hosts
    from meshsim.launch.logs import RankLogs

    options = LaunchOptions()
    logs = RankLogs(Topology(1, 2), options, None, None, None)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert {(h.threads, h.env["OMP_NUM_THREADS"]) for h in _hosts(Topology(1, 2), options, 0, logs, True)} == \
        {(3, "3")}
    monkeypatch.delenv("OMP_NUM_THREADS")
    one = _hosts(Topology(2, 1), options, 0, RankLogs(Topology(2, 1), options, None, None, None), True)
    assert {(h.threads, h.env["OMP_NUM_THREADS"]) for h in one} == {(None, None)}  # one a host: torchrun sets none


def test_virtual_local_rank_shows_each_rank_its_one_gpu_as_device_0():
    result = launch(os.path.join(SCRIPTS, "streams.py"), Topology(1, 2), virtual_local_rank=True, deadline=60)
    assert result.passed, result.report()
    assert [o.splitlines()[0] for o in result.outputs] == ["out meshsim-host0:0 sees 1 gpus, attempt 0"] * 2


# --------------------------------------------------------------------------------------------- restarts


def test_a_failure_restarts_every_rank_which_resumes_from_its_hosts_snapshot(tmp_path):
    result = launch(os.path.join(SCRIPTS, "resumes.py"), Topology(2, 2), args=["1"], max_restarts=2,
                    host_dirs=str(tmp_path), deadline=120)
    assert result.passed, result.report()
    assert len(result.attempts) == 1 and result.attempts[0].exit_codes[1] == 1
    for output in result.outputs:  # every rank restarted, and each host's rank 0 left it a snapshot at epoch 2
        assert output.splitlines()[0] == "attempt 1 of 3 starts at epoch 2" and "trained 4 epochs" in output
    report = result.report()
    assert "restarted every rank 1 time" in report
    assert "attempt 0 failed: rank 1: RuntimeError: simulated fault on rank 1 at resumes.py:22" in report


def test_restarts_stop_at_max_restarts_and_the_report_says_why_each_attempt_failed():
    result = launch(os.path.join(SCRIPTS, "exits.py"), Topology(1, 2), max_restarts=2, deadline=60)
    assert result.outcome == "error" and len(result.attempts) == 2 and result.exit_codes == [0, 3]
    report = result.report()
    assert report.count("failed: rank 1: exited with code 3") == 2 and "rank 1: exited with code 3" in report


def test_a_hang_is_diagnosed_not_restarted():
    result = launch(os.path.join(SCRIPTS, "skip_in_loop.py"), Topology(1, 2), max_restarts=2, deadline=3)
    assert result.outcome == "hang" and result.attempts == [] and result.culprits == [1]


# --------------------------------------------------------------------------------------------- logs


def test_redirects_tee_and_the_local_ranks_filter_route_streams_as_torchrun_does(tmp_path):
    """-r 0:1 sends local rank 0's stdout to its file only; -t 1:2,0:2 tees both local ranks' stderr; the filter
    shows local rank 1 alone on the console: torchrun's console and torchrun's files, a directory a host."""
    out = subprocess.run([sys.executable, "-m", "meshsim", "launch", "--nnodes=1:2", "--nproc_per_node=gpu",
                          "--devices-per-host=2", "--log-dir", str(tmp_path), "-r", "0:1", "-t", "1:2,0:2",
                          "--local-ranks-filter", "1", "--duplicate-stderr-filters", "err",
                          os.path.join(SCRIPTS, "streams.py")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    # Ranks print concurrently, on a cluster as here: which rank's line comes first is not defined (sorted).
    assert sorted(out.stdout.splitlines()) == ["[rank1]:out meshsim-host0:1 sees 2 gpus, attempt 0",
                                               "[rank3]:out meshsim-host1:1 sees 2 gpus, attempt 0"]
    assert sorted(line for line in out.stderr.splitlines() if line.startswith("[rank")) == [
        "[rank1]:err meshsim-host0:1", "[rank3]:err meshsim-host1:1"]
    for host in (0, 1):
        (run,) = (tmp_path / f"host{host}").iterdir()  # torchrun's <run id>_<suffix>
        attempt = run / "attempt_0"
        assert sorted(p.name for p in (attempt / "0").iterdir()) == ["stderr.log", "stdout.log"]
        assert sorted(p.name for p in (attempt / "1").iterdir()) == ["stderr.log"]
        assert (attempt / "0" / "stdout.log").read_text() == f"out meshsim-host{host}:0 sees 2 gpus, attempt 0\n"
        assert (attempt / "1" / "stderr.log").read_text() == f"err meshsim-host{host}:1\n"
        # the filter copies what the console shows of tee'd streams (torchrun's TailLog of tee_stderrs)
        assert (attempt / "filtered_stderr.log").read_text() == f"[default1]:err meshsim-host{host}:1\n"
    assert (tmp_path / "rank2.log").read_text().splitlines() == ["out meshsim-host1:0 sees 2 gpus, attempt 0",
                                                                "err meshsim-host1:0"]


# --------------------------------------------------------------------------------------------- headline


def test_the_failure_headline_is_the_errors_own_line_where_the_message_spans_lines_and_notes_follow():
    result = launch(os.path.join(SCRIPTS, "raises_chained.py"), Topology(1, 2), deadline=60)
    assert result.exit_codes == [0, 1]
    headline = "ValueError: cannot read checkpoint.pt at raises_chained.py:11"
    assert f"rank 1 raised {headline}" in result.diagnosis.summary
    assert f"rank 1: {headline}" in result.report()


def test_ranks_that_fail_without_an_exception_are_named_with_their_exit_and_line_alike_ones_grouped():
    result = launch(os.path.join(SCRIPTS, "exits_quietly.py"), Topology(1, 4), deadline=60)
    assert result.outcome == "crash" and result.exit_codes[1:] == [1, 1, -9]
    report = result.report()
    assert "ranks 1-2: exited with code 1: sys.exit('no shard for rank 1') at exits_quietly.py:8" in report
    assert "rank 3: died (killed by signal 9, no exception)" in report


@pytest.mark.parametrize("make, line", [
    (lambda: ValueError("first\nsecond"), "ValueError: first"),
    (lambda: _noted(KeyError("k")), "KeyError: 'k'"),
    (lambda: SyntaxError("'(' was never closed", ("x.py", 3, 4, "f(\n", 3, 5)), "SyntaxError: '(' was never closed"),
    (lambda: ExceptionGroup("several", [ValueError("a")]), "ExceptionGroup: several (1 sub-exception)"),
    (lambda: SystemError(), "SystemError"),
])
def test_the_exception_line_is_the_type_and_the_first_line_of_its_message(make, line):
    from meshsim.run.rank import exception_line

    assert exception_line(make()) == line


def _noted(exc):
    exc.add_note("a note after the message")
    return exc
