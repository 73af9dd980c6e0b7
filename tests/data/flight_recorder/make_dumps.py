"""Make every case's dumps again: `python make_dumps.py [CASE...]` from this directory (torch, no GPU).

Each case is a directory with a script.py; its dumps go to CASE/dumps/fr_trace_rank_<rank>, written by
frcase.py from inside each rank. Runs one case at a time under torchrun (8 ranks on gloo, loopback).
"""

import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUFFER = {"long_loop_small_buffer": 6}  # Flight Recorder entries kept per rank; 16 unless named here
RANKS = 8


def make(case: str) -> None:
    out = os.path.join(HERE, case, "dumps")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(BUFFER.get(case, 16)),
               TORCH_FR_DUMP_TEMP_FILE=os.path.join(out, "fr_trace_rank_"), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore::FutureWarning")
    began = time.monotonic()
    run = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", str(RANKS), "script.py"],
                         cwd=os.path.join(HERE, case), env=env, capture_output=True, text=True, timeout=400,
                         check=False)  # a hang's torchrun fails by design: the dumps are what counts
    notes = [line for line in run.stdout.splitlines() if line.startswith("[frcase]")]
    print(f"{case}: torchrun exit {run.returncode} after {time.monotonic() - began:.0f} s; "
          f"{len(os.listdir(out))} dumps", *notes, sep="\n  ")


if __name__ == "__main__":
    cases = sys.argv[1:] or sorted(d for d in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, d, "script.py")))
    for name in cases:
        make(name)
