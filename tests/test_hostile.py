"""meshsim's promises under hostile input: bad input is exit 2 in one line with nothing started, every run is
bounded, no process outlives the run, signals end a run in one line, and nothing listens beyond loopback."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest
from helpers import alive, kill_session, session_of, wait_for

from meshsim import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
GOOD = """
name = "good"
[topology]
hosts = 2
devices_per_host = 4
[[step]]
op = "init_device_mesh"
shape = [2, 4]
names = ["dp", "tp"]
out = "m"
{extra_step}
[[step]]
op = "check"
mesh = "m"
{extra}
"""

# What each hostile file adds to a valid 2x4 scenario, and a word the one-line error must contain.
HOSTILE = {
    "only_on-not-a-list": ({"extra_step": "[[step]]\nop = 'barrier'\nmesh = 'm'\ndim = 0\nonly_on = 5"}, "only_on"),
    "skip_on-not-a-list": ({"extra_step": "[[step]]\nop = 'barrier'\nmesh = 'm'\ndim = 0\nskip_on = 5"}, "skip_on"),
    "op-a-list": ({"extra_step": "[[step]]\nop = ['x']"}, "unknown op"),
    "on_rank-not-a-table": ({"extra_step": "[[step]]\nop = 'barrier'\nmesh = 'm'\ndim = 0\non_rank = {'3' = 5}"},
                            "on_rank.3"),
    "on_rank-superscript-key": ({"extra_step": "[[step]]\nop = 'barrier'\nmesh = 'm'\ndim = 0\n"
                                               "[step.on_rank.\"\u00b2\"]\ndim = 1"}, "rank number"),
    "findings-a-number": ({"extra": "[expect]\nfindings = 5"}, "findings"),
    "findings-nested": ({"extra": "[expect]\nfindings = [[1]]"}, "findings"),
    "mesh_dim-a-list": ({"extra": "[expect]\nmesh_dim = ['tp']"}, "mesh_dim"),
    "culprit-a-bool": ({"extra": "[expect]\nculprit_ranks = [true]"}, "culprit_ranks"),
    "kind-unknown": ({"extra": "[expect]\nkind = 'cosmic ray'"}, "kind"),
    "kind-against-outcome": ({"extra": "[expect]\noutcome = 'hang'\nkind = 'too slow for its deadline'"}, "slow"),
    "expect_error-a-string": ({"extra_step": "[[step]]\nop = 'barrier'\nmesh = 'm'\ndim = 0\nexpect_error = 'false'"},
                              "expect_error"),
    "huge-shape": ({"extra_step": "[[step]]\nop = 'init_device_mesh'\nshape = [100000000000, 100000000000]\n"
                                  "out = 'h'\nexpect_error = true"}, "shape"),
    "numel-huge": ({"extra_step": "[[step]]\nop = 'all_reduce'\nmesh = 'm'\ndim = 0\nnumel = 1000000000000"}, "numel"),
    "numel-negative": ({"extra_step": "[[step]]\nop = 'all_reduce'\nmesh = 'm'\ndim = 0\nnumel = -5"}, "numel"),
    "sleep-nan": ({"extra_step": "[[step]]\nop = 'sleep'\nseconds = nan"}, "seconds"),
    "sleep-inf": ({"extra_step": "[[step]]\nop = 'sleep'\nseconds = inf"}, "seconds"),
    "src-huge": ({"extra_step": "[[step]]\nop = 'broadcast'\nmesh = 'm'\ndim = 0\nsrc = 100000000000000000"}, "src"),
    "deadline-huge": ({"extra": "deadline = 1000000.0"}, "deadline"),
    "deadline-nan": ({"extra": "deadline = nan"}, "deadline"),
    "deadline-inf": ({"extra": "deadline = inf"}, "deadline"),
    "deadline-tiny": ({"extra": "deadline = 0.001"}, "deadline"),
}


def _write(tmp_path, name, fields):
    text = GOOD.format(extra_step=fields.get("extra_step", ""), extra="")
    if "extra" in fields:  # top-level keys go before the first table, [expect] after the steps
        extra = fields["extra"]
        text = (extra + "\n" + text) if extra.startswith("deadline") else text + "\n" + extra
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.fixture
def no_cluster(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started for bad input")

    monkeypatch.setattr("meshsim.run.pool.WorkerPool.start", refuse)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_scenario_field_is_exit_2_in_one_line_before_anything_starts(tmp_path, capsys, no_cluster, name):
    fields, word = HOSTILE[name]
    path = _write(tmp_path, name, fields)
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and word in err and "Traceback" not in err, err


@pytest.mark.parametrize("content", [random.Random(0).randbytes(4096), b"[[step]]\nop = " + b"[" * 5000 + b"]" * 5000,
                                     b"a = " + b"[" * 5000 + b"]" * 5000],
                         ids=["random-bytes", "op-nested-5000-deep", "key-nested-5000-deep"])
def test_garbage_files_are_exit_2_in_one_line(tmp_path, capsys, no_cluster, content):
    path = tmp_path / "garbage.toml"
    path.write_bytes(content)
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err


def test_a_deeply_nested_layout_is_refused(tmp_path, capsys, no_cluster):
    layout = "[" * 50 + "0" + "]" * 50
    path = _write(tmp_path, "deep", {"extra_step": f"[[step]]\nop = 'mesh'\nlayout = {layout}\nout = 'd'"})
    assert cli.main(["run", str(path)]) == 2
    assert "layout" in capsys.readouterr().err


def test_a_name_with_markup_is_printed_literally(tmp_path):
    (tmp_path / "[red]x[").mkdir()
    path = tmp_path / "[red]x[" / "oops].toml"  # the path reads "[red]x[/oops].toml": markup, if not escaped
    path.write_text(GOOD.format(extra_step="", extra="").replace('name = "good"', 'name = "[/oops]"'))
    out = subprocess.run([sys.executable, "-m", "meshsim", "run", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[/oops]" in out.stdout and "[red]x[/oops].toml" in out.stdout


@pytest.mark.parametrize("args", [["fuzz", "--deadline", "0.001"], ["fuzz", "--deadline", "nan"],
                                  ["fuzz", "--deadline", "1e9"], ["run", "x.toml", "--deadline", "inf"],
                                  ["fuzz", "--save", "/etc/passwd"], ["nightly", "--junit", "/etc/passwd/y.xml"],
                                  ["nightly", "--json-out", "/"], ["nightly", "--scenarios", "/nonexistent"],
                                  ["nightly", "--torchrun"]])
def test_bad_options_are_exit_2_in_one_line_before_anything_starts(capsys, no_cluster, args):
    with pytest.raises(SystemExit) as info:
        code = cli.main(args)
        raise SystemExit(code)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].startswith(("meshsim: error:", "usage:")) or "error:" in err
    assert "Traceback" not in err


def test_an_empty_scenario_directory_named_explicitly_is_exit_2(tmp_path, capsys, no_cluster):
    assert cli.main(["nightly", "--scenarios", str(tmp_path)]) == 2
    assert "holds no" in capsys.readouterr().err


def _meshsim(*args, timeout=240, env=None):
    return subprocess.run([sys.executable, "-m", "meshsim", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=HERE, env=dict(os.environ, PYTHONPATH=HERE, **(env or {})))


@pytest.mark.parametrize("setup, word", [("hostile:sleeps_forever", "hang"), ("hostile:exits", "crash"),
                                         ("hostile:raises", "error")])
def test_a_failing_setup_ends_the_run_with_exit_2_and_says_why(setup, word):
    out = _meshsim("fuzz", "--hosts", "1", "--devices-per-host", "2", "--examples", "5", "--setup", setup,
                   "--start-timeout", "5")
    assert out.returncode == 2, out.stdout + out.stderr
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and setup in err[0] and word in err[0], out.stderr


SPAWNS = textwrap.dedent("""
    import json, os, subprocess, sys
    from meshsim import Cluster, Topology

    def spawn():
        child = subprocess.Popen(["sleep", "300"])
        pid = os.fork()
        if pid == 0:
            import time
            time.sleep(300)
            os._exit(0)
        return [child.pid, pid]

    if __name__ == "__main__":
        with Cluster(Topology(1, 2)) as cluster:
            pids = [p for pair in cluster.run_fn(spawn).values for p in pair] + cluster.pids
        print(json.dumps(pids))
""")


def test_processes_a_rank_starts_do_not_outlive_the_run(tmp_path):
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pids = json.loads(out.stdout.strip().splitlines()[-1])
    wait_for(lambda: not [p for p in pids if alive(p)], what="every process the ranks started to end")


HOLDS_THE_GIL = textwrap.dedent("""
    import json, sys, multiprocessing.forkserver as fs
    from meshsim import Cluster, Topology

    def pause():
        import ctypes, os
        open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()  # "inside pause() now"
        ctypes.PyDLL(None).pause()  # a C call that keeps the GIL: the rank's own threads cannot run

    if __name__ == "__main__":
        cluster = Cluster(Topology(1, 2)).start()
        print(json.dumps({"pids": cluster.pids + [fs._forkserver._forkserver_pid, cluster.pool._reaper.process.pid],
                          "folder": cluster.pool._tmp.name}), flush=True)
        cluster.run_fn(pause, deadline=600)
""")


def test_sigkill_of_the_controller_leaves_nothing_even_while_a_rank_holds_the_gil(tmp_path):
    script = tmp_path / "gil.py"
    script.write_text(HOLDS_THE_GIL)
    marks = tmp_path / "inside"
    marks.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(marks)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stdout.readline())
        pids = started["pids"]
        wait_for(lambda: len(os.listdir(marks)) == 2, what="both ranks to be inside pause()")
        proc.kill()
        proc.wait(30)
        wait_for(lambda: not [p for p in pids if alive(p)], what="every process of the run to end")
        wait_for(lambda: not os.path.exists(started["folder"]), what="the run's folder to be removed")
    finally:
        kill_session(proc)


@pytest.mark.parametrize("signum, code, when", [(signal.SIGTERM, 143, "sweeping"), (signal.SIGINT, 130, "sweeping"),
                                               (signal.SIGINT, 130, "starting"), (signal.SIGTERM, 143, "starting"),
                                               (signal.SIGINT, 130, "importing")])
def test_a_signal_ends_a_fuzz_run_in_one_line_with_its_exit_code_and_no_process_left(signum, code, when):
    proc = subprocess.Popen([sys.executable, "-m", "meshsim", "fuzz", "--hosts", "1", "--devices-per-host", "2",
                             "--examples", "100000", "--seed", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=HERE, start_new_session=True)
    try:
        # Events, not wall-clock: the sweep has ranks; the forkserver is starting them; nothing is started yet.
        wait_for(lambda: _catches(proc.pid, signal.SIGTERM))  # meshsim's own handlers are in place
        if when == "sweeping":
            wait_for(lambda: _children_named(proc.pid, "meshsim-r"))
        elif when == "starting":
            wait_for(lambda: session_of(proc.pid) - {proc.pid})
        os.killpg(proc.pid, signum)  # as a terminal does: the whole foreground group gets it
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == code, err
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and "meshsim:" in lines[0], err
        wait_for(lambda: not session_of(proc.pid), what="every process of the run to end")
    finally:
        kill_session(proc)


def _catches(pid, signum):
    """Whether the process has a handler of its own for `signum` (SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            mask = next(int(line.split()[1], 16) for line in fh if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask & (1 << (signum - 1)))


def _children_named(root, prefix):
    """Descendants of `root` whose process name starts with `prefix`."""
    parents, names = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                stat = fh.read()
            names[int(pid)] = stat[stat.index("(") + 1:stat.rindex(")")]
            parents[int(pid)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue

    def descends(pid):
        while pid in parents and pid != root:
            pid = parents[pid]
        return pid == root

    return [pid for pid, name in names.items() if name.startswith(prefix) and descends(pid)]


def test_local_clusters_listen_on_loopback_even_with_a_users_gloo_interface(monkeypatch):
    from test_cluster import _listening_sockets

    from meshsim import Cluster, Topology

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    with Cluster(Topology(1, 2)) as cluster:
        cluster.run_fn(lambda: None)
        listening = _listening_sockets(cluster.pids)
    assert listening
    assert all(address.split(":")[0] in ("0100007F", "00000000000000000000000001000000") for address in listening)
