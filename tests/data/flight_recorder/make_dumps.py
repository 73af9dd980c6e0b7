"""Make every case's dumps again: `python make_dumps.py [CASE...]` from this directory (torch, no GPU).

Each case is a directory with a script.py; its dumps go to CASE/dumps/fr_trace_rank_<rank>, written by
frcase.py from inside each rank. Runs one case at a time under torchrun (8 ranks on gloo unless RANKS says
otherwise; loopback). A case that outlives its limit (LIMIT_S) is ended as a scheduler ends a hung job:
SIGTERM to torchrun, which passes it to the ranks (frcase dumps on it), then SIGKILL to what is left.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUFFER = {"long_loop_small_buffer": 6}  # Flight Recorder entries kept per rank; 16 unless named here
RANKS = {"skip_on_mesh_dim_16": 16}  # ranks of a case; 8 unless named here
# seconds before the job is ended from outside; 400 unless named here. In skip_group_creation seven ranks hang
# inside gloo's group construction, which holds the GIL, so no Python thread of theirs can dump: only rank 5
# ever writes one, and nothing else will happen.
LIMIT_S = {"skip_group_creation": 60}
GRACE_S = 30  # torchrun's own wait after SIGTERM before it kills the ranks


def make(case: str) -> None:
    out = os.path.join(HERE, case, "dumps")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(BUFFER.get(case, 16)),
               TORCH_FR_DUMP_TEMP_FILE=os.path.join(out, "fr_trace_rank_"), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore::FutureWarning")
    began = time.monotonic()
    # its own session: whatever is left of the job at the end is killed with it, never orphaned
    job = subprocess.Popen(["torchrun", "--standalone", "--nproc-per-node", str(RANKS.get(case, 8)), "script.py"],
                           cwd=os.path.join(HERE, case), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=LIMIT_S.get(case, 400))
    except subprocess.TimeoutExpired:
        job.send_signal(signal.SIGTERM)
        try:
            output, _ = job.communicate(timeout=GRACE_S + 10)
        except subprocess.TimeoutExpired:
            output = ""
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait()
    notes = [line for line in (output or "").splitlines() if line.startswith("[frcase]")]
    print(f"{case}: torchrun exit {job.returncode} after {time.monotonic() - began:.0f} s; "  # a hang fails by design
          f"{len([n for n in os.listdir(out) if not n.endswith('.tmp')])} dumps", *notes, sep="\n  ", flush=True)


if __name__ == "__main__":
    cases = sys.argv[1:] or sorted(d for d in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, d, "script.py")))
    for name in cases:
        make(name)
