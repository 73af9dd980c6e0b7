"""Small helpers shared by the tests (tests/ is on sys.path under pytest)."""

import os
import signal
import time


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def wait_for(condition, within=120.0, what="the run to get there"):
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"waited {within:g} s for {what}"
        time.sleep(0.05)


def session_of(sid):
    """The live processes of a session: a run's controller, forkserver and ranks (the reaper has its own)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.add(int(pid))
    return found


def kill_session(proc):
    """Whatever the assertions said, nothing of the run outlives the test."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=30)
    for pid in session_of(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def checklist_results(result) -> list[dict]:
    """Each rank's check values from a launch of a script built on launch_scripts/checklist.py (its one RESULTS
    line), after asserting that no check raised."""
    import json

    by_rank = []
    for output in result.outputs:
        (line,) = [line for line in output.splitlines() if line.startswith("RESULTS ")]
        by_rank.append(json.loads(line[len("RESULTS "):]))
    for rank, results in enumerate(by_rank):
        errors = {name: value for name, value in results.items()
                  if isinstance(value, str) and value.startswith("error:")}
        assert not errors, (rank, errors)
    return by_rank
