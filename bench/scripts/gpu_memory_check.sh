#!/usr/bin/env bash
# The simulated GPU's memory next to a real one's: the same torchtitan-like job (tests/launch_scripts/titan_like.py:
# meta init, FSDP2 with bf16 mixed precision, AdamW; with TP when given 2 ranks) on the GPUs of this machine under
# torchrun, then on simulated GPUs under `meshsim launch` (forced with --devices-per-host beyond the real count).
# Prints each run's peak active bytes, FSDPMemTracker's estimate and their ratio. Run it where a GPU is lent:
#     bash bench/scripts/gpu_memory_check.sh 1        # one rank
#     bash bench/scripts/gpu_memory_check.sh 2        # two ranks, TP 2
set -euo pipefail
cd "$(dirname "$0")/../.."
RANKS=${1:-1}
TP=$RANKS
OUT=$(mktemp -d)
torchrun --standalone --nproc-per-node "$RANKS" tests/launch_scripts/titan_like.py "$TP" > "$OUT/gpu.log" 2>&1
# meshsim simulates GPUs when the machine has fewer than the hosts show: ask for more than it has
python -m meshsim launch --nproc-per-node "$RANKS" --devices-per-host 64 --deadline 600 \
    tests/launch_scripts/titan_like.py "$TP" > "$OUT/sim.log" 2>&1
python - "$OUT/gpu.log" "$OUT/sim.log" <<'PY'
import json, sys
def first(path):
    for line in open(path):
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])["memory"]
    raise SystemExit(f"no RESULT line in {path}")
gpu, sim = first(sys.argv[1]), first(sys.argv[2])
print(f"{'':28}{'real GPU':>14}{'meshsim':>14}{'meshsim/GPU':>13}")
for key in ("meshsim_peak", "reserved_peak", "fsdp_mem_tracker_peak", "after"):
    print(f"{key:28}{gpu[key]:>14,}{sim[key]:>14,}{sim[key] / gpu[key]:>13.3f}")
PY
