"""`meshsim launch`: unmodified torchrun scripts on simulated hosts x GPUs, bounded, with the diagnosis."""

import os
import subprocess
import sys

import pytest

from meshsim import Topology
from meshsim.judge.report import group_map, grouped_tracebacks
from meshsim.launch.launcher import LaunchFailed, launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "meshsim", "examples", "scripts")
SCRIPTS = os.path.join(ROOT, "tests", "launch_scripts")


def meshsim_launch(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "meshsim", "launch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=RECIPE)


@pytest.mark.parametrize("script", ["2d_setup_with_device_mesh.py", "hsdp.py", "3d_custom_parallel.py"])
def test_the_recipes_device_mesh_scripts_run_unchanged_on_2_hosts_x_4_gpus(script):
    out = meshsim_launch("--nnodes", "2", "--nproc-per-node", "4", script)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "all ranks exited 0" in out.stderr


def test_2d_setup_runs_on_1_host_x_8_with_the_recipes_own_torchrun_flags():
    out = meshsim_launch("--nproc_per_node=8", "--rdzv_id=100", "--rdzv_endpoint=localhost:29400", "2d_setup.py")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[rank7]:Running example on rank=7 in a world with world_size=8" in out.stdout


def test_2d_setup_fails_on_2_hosts_x_4_on_ranks_4_to_7_as_real_hardware_would():
    result = launch(os.path.join(RECIPE, "2d_setup.py"), Topology(2, 4), deadline=60)
    assert result.outcome == "error" and result.exit_codes == [0, 0, 0, 0, 1, 1, 1, 1]
    ((ranks, title, _),) = grouped_tracebacks(result)
    assert ranks == [4, 5, 6, 7] and "invalid device ordinal" in title and title.endswith("at 2d_setup.py:13")
    _, notes = group_map(result.record, result.topology)
    assert notes == ["ranks 4-7 are in none of the groups made by new_group (others are)"]
    with pytest.raises(LaunchFailed, match="ranks 4-7: torch.AcceleratorError: CUDA error: invalid device ordinal"):
        result.raise_for_outcome()


def test_fsdp2_and_dtensor_run_on_cuda_meshes_of_simulated_gpus_and_get_the_arguments():
    result = launch(os.path.join(SCRIPTS, "fsdp2_dtensor.py"), Topology(2, 2), args=["--steps", "1"], deadline=120)
    assert result.passed, result.report()
    assert all("ok ['--steps', '1']" in output for output in result.outputs)


def test_a_skipped_collective_is_a_hang_diagnosed_at_the_deadline_with_group_dim_and_script_line(tmp_path):
    result = launch(os.path.join(SCRIPTS, "skip_collective.py"), Topology(2, 4), deadline=3, log_dir=str(tmp_path))
    assert result.record.stopped == "deadline" and result.record.deadline == 3
    assert result.outcome == "hang" and result.diagnosis.culprits == [5]
    headline = result.diagnosis.summary
    assert "on group [4, 5, 6, 7]" in headline and "dim 'tp'" in headline and "in the script" in headline
    report = result.report()
    assert "rank 4 is at skip_collective.py:12" in report and "rank 0 is at skip_collective.py:13" in report
    assert sorted(os.listdir(tmp_path)) == ["flight_recorder", "hang.html", "hang.svg", "host0", "host1"] + [
        f"rank{r}.log" for r in range(8)]  # (host<h>: torchrun's log layout of each simulated host)


def test_an_api_meshsim_does_not_simulate_raises_naming_it():
    result = launch(os.path.join(SCRIPTS, "refused.py"), Topology(1, 2), deadline=60)
    ((ranks, title, _),) = grouped_tracebacks(result)
    assert ranks == [0, 1] and "torch.cuda.list_gpu_processes" in title and "does not simulate" in title


def test_exit_codes_come_back_and_a_failing_rank_stops_the_others():
    out = meshsim_launch("--nproc-per-node", "2", os.path.join(SCRIPTS, "exits.py"))
    assert out.returncode == 1 and "exit codes by rank: 0:0, 1:3" in out.stderr


def test_a_module_runs_with_dash_m():
    out = subprocess.run([sys.executable, "-m", "meshsim", "launch", "--nproc-per-node", "4", "-m", "fsdp2_dtensor",
                          "x"], capture_output=True, text=True, timeout=300, cwd=SCRIPTS)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[rank1]:ok ['x']" in out.stdout


def test_a_scripts_own_warnings_show_as_under_torchrun(tmp_path):
    script = tmp_path / "warns.py"
    script.write_text("import warnings\nwarnings.warn('log_every_n_steps is larger than the batches')\n")
    out = subprocess.run([sys.executable, "-m", "meshsim", "launch", "--nproc-per-node", "2", str(script)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (out.stdout + out.stderr).count("UserWarning: log_every_n_steps is larger than the batches") == 2


@pytest.mark.parametrize("args", [["nope.py"], ["-m", "no_such_module_here"], ["--nnodes", "0", "x.py"],
                                  ["--deadline", "nan", "hsdp.py"], ["--nnodes", "100", "--nproc-per-node", "100",
                                                                     "hsdp.py"],
                                  ["--nnodes=1:20", "--nproc-per-node=gpu", "hsdp.py"], ["--no-python", "hsdp.py"]])
def test_bad_usage_is_exit_2_in_one_line_and_starts_nothing(args):
    out = meshsim_launch(*args, timeout=60)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_ddp_as_gpu_scripts_write_it_runs_on_simulated_gpus_and_averages_gradients():
    result = launch(os.path.join(SCRIPTS, "ddp_cuda.py"), Topology(2, 2), deadline=120)
    assert result.passed, result.report()
    sums = {output.strip().splitlines()[-1] for output in result.outputs}
    assert len(sums) == 1 and next(iter(sums)).startswith("ok ")  # every rank holds the same averaged gradient


@pytest.mark.parametrize("ending", ["", "raise SystemExit(3)", "raise ValueError('boom')"])
def test_what_a_launched_script_leaves_behind_lives_until_its_rank_exits(tmp_path, monkeypatch, ending):
    """As in a real process, the end of a script is not where its objects die: destroying a DDP model there
    (its Reducer holds a gloo group and is freed holding the GIL) deadlocked one launch in about twelve."""
    import gc
    import weakref

    from meshsim.core.wire import RunScript
    from meshsim.run import rank

    script = tmp_path / "leaves_a_model.py"
    script.write_text("class Model:\n    pass\nmodel = Model()\n" + ending + "\n")
    monkeypatch.setattr(rank, "_SCRIPT_REMAINS", [])
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    done = rank.run_script(RunScript(str(script), False, [], 10.0))
    models = [o for o in gc.get_objects() if type(o).__name__ == "Model" and type(o).__module__ == "__main__"]
    assert done.exit_code == (0 if not ending else 3 if "SystemExit" in ending else 1)
    assert len(models) == 1, "the script's model was destroyed when the script returned"
    alive = weakref.ref(models[0])
    del models
    rank._SCRIPT_REMAINS.clear()
    gc.collect()
    assert alive() is None  # kept by meshsim alone, not leaked by something else


def test_a_stack_with_only_meshsims_frames_says_so_instead_of_showing_nothing():
    from meshsim.judge.diagnose import _group_stacks

    dump = ('Current thread 0x00007f (most recent call first):\n'
            '  File "/x/meshsim/run/rank.py", line 200 in run_script\n'
            '  File "/x/meshsim/run/rank.py", line 171 in run\n')
    ((ranks, text),) = _group_stacks({3: dump})
    assert ranks == [3] and "no frame of the user's code" in text


def test_a_ranks_lines_arrive_whole_while_native_code_writes_beside_python():
    result = launch(os.path.join(SCRIPTS, "interleaves.py"), Topology(1, 2), deadline=120)
    assert result.passed, result.report()
    for rank, output in enumerate(result.outputs):
        lines = output.splitlines()
        python = [line for line in lines if line != "native line"]
        assert python == [f"piece {i} of a python line from rank {rank}" for i in range(2000)]
        assert len(lines) - len(python) == 2000


def test_every_rank_gets_torchruns_error_file_and_record_writes_its_exception_there(tmp_path):
    # torchrun sets TORCHELASTIC_ERROR_FILE for every worker, in a temporary log directory without --log-dir
    script = tmp_path / "records.py"
    script.write_text("import os\nfrom torch.distributed.elastic.multiprocessing.errors import record\n\n\n@record\n"
                      "def main():\n    print('error file', os.environ.get('TORCHELASTIC_ERROR_FILE'), flush=True)\n"
                      "    if os.environ['RANK'] == '1':\n        raise ValueError('rank 1 fails')\n\n\nmain()\n")
    result = launch(str(script), Topology(1, 2), deadline=60)
    paths = [line.split()[-1] for output in result.outputs for line in output.splitlines()
             if line.startswith("error file")]
    assert [p.split(os.sep)[-3:] for p in paths] == [["attempt_0", "0", "error.json"], ["attempt_0", "1", "error.json"]]
    with open(paths[1]) as written:  # @record's error.json, as torchrun's agent reads it
        assert "ValueError: rank 1 fails" in written.read()
    assert not os.path.exists(paths[0])


def test_the_same_failure_on_every_rank_is_said_once_for_all_of_them():
    result = launch(os.path.join(SCRIPTS, "refused.py"), Topology(1, 2), deadline=60)
    text = result.report()
    said = [line for line in text.splitlines() if "does not simulate" in line and "Traceback" not in line]
    assert not any(line.lstrip().startswith(("also: rank", "rank 0:", "rank 1:")) for line in said), text


def test_a_slow_ranks_rate_keeps_two_significant_figures_below_ten_calls_a_second():
    from meshsim.core.pace import rate_text

    assert [rate_text(r) for r in (0.25, 3.14159, 12.6, 523.7)] == ["0.25", "3.1", "13", "524"]


def test_each_rank_gets_the_environment_torchruns_agent_exports():
    out = meshsim_launch("--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "1", "--role", "trainer",
                         "--signals-to-handle", "SIGTERM,SIGUSR1", os.path.join(SCRIPTS, "torchrun_env.py"))
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    envs = sorted((json.loads(line.split("ENV ", 1)[1]) for line in out.stdout.splitlines() if "ENV " in line),
                  key=lambda env: int(env["RANK"]))
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["ROLE_RANK"]) for e in envs] == [
        ("0", "0", "0", "0"), ("1", "1", "0", "1"), ("2", "0", "1", "2"), ("3", "1", "1", "3")]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"], e["ROLE_WORLD_SIZE"], e["ROLE_NAME"],
             e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"], e["TORCHELASTIC_USE_AGENT_STORE"],
             e["TORCH_NCCL_ASYNC_ERROR_HANDLING"], e["TORCHELASTIC_SIGNALS_TO_HANDLE"]) for e in envs} == {
        ("4", "2", "2", "4", "trainer", "0", "1", "True", "1", "SIGTERM,SIGUSR1")}
    # torchrun starts each worker in a session of its own (start_new_session); Linux schedules by session, and
    # ranks of one session ran a step's all_reduce a third slower
    assert all(e["own_session"] for e in envs)
