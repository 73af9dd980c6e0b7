"""torchtitan on a simulated cluster: its llama3 debug model with FSDP, unmodified, a training step on 2 hosts x 4
simulated GPUs under `meshsim launch`, next to the same job on 1 simulated GPU measured in the same run (what
eight ranks cost on this machine). A step's time is the time between torchtitan's own step log lines.

Needs torchtitan installed (`pip install torchtitan==0.2.2 triton`) and TORCHTITAN_REPO, a checkout of its
release tag (its configs and tokenizer are not in the wheel); without either the section says so and skips.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import tempfile

from figures import Figure

STEP = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?step:\s*(\d+)\s+loss:\s*([0-9.]+)")
CONFIG = "torchtitan/models/llama3/train_configs/debug_model.toml"


def skipped() -> str | None:
    """Why the section cannot run here, in one line (None: it can)."""
    if importlib.util.find_spec("torchtitan") is None:
        return "torchtitan is not installed (pip install torchtitan==0.2.2 triton)"
    repo = os.environ.get("TORCHTITAN_REPO")
    if not repo or not os.path.isfile(os.path.join(repo, CONFIG)):
        return "TORCHTITAN_REPO is not a checkout of torchtitan's release tag (its configs and tokenizer)"
    return None


def text_dataset(folder: str, records: int = 2000) -> str:
    """A JSON-lines file of {"text": ...} records, standing in for torchtitan's c4_test set."""
    words = ("the model trains on sharded meshes while every rank keeps its own slice of each layer and the "
             "optimizer steps after gradients are reduced across hosts").split()
    rng = random.Random(0)
    path = os.path.join(folder, "c4_test")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "data.json"), "w") as fh:
        for _ in range(records):
            fh.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(400))}) + "\n")
    return path


def step_time(repo: str, data: str, hosts: int, per_host: int, steps: int) -> tuple[float, float]:
    """(seconds a step, the last step's loss) of torchtitan's FSDP debug job on hosts x per_host simulated GPUs."""
    command = [sys.executable, "-m", "meshsim", "launch", "--deadline", "3000", "--nnodes", str(hosts),
               "--nproc-per-node", str(per_host), "--local-ranks-filter", "0", "--role", "rank", "--tee", "3",
               "-m", "torchtitan.train", "--job.config_file", CONFIG, "--training.steps", str(steps),
               "--training.seq_len", "256", "--training.local_batch_size", "2", "--training.dataset_path", data,
               "--metrics.disable_color_printing", "--debug.seed", "42"]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=3600)
    found = [(datetime.datetime.strptime(when, "%Y-%m-%d %H:%M:%S,%f"), int(step), float(loss))
             for when, step, loss in STEP.findall(done.stdout)]
    if done.returncode != 0 or len(found) < 2:
        raise RuntimeError(f"torchtitan on {hosts}x{per_host} exited {done.returncode}: {done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    (first, first_step, _), (last, last_step, loss) = found[0], found[-1]
    return (last - first).total_seconds() / (last_step - first_step), loss


def run(quick: bool = False) -> list[Figure]:
    why = skipped()
    if why is not None:
        print(f"torchtitan: skipped: {why}")
        return []
    repo = os.environ["TORCHTITAN_REPO"]
    steps = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="meshsim-bench-titan-") as folder:
        data = text_dataset(folder)
        one, _ = step_time(repo, data, 1, 1, steps)
        eight, loss = step_time(repo, data, 2, 4, steps)
    return [Figure("torchtitan", "llama3 debug model, FSDP 8: a training step on 2x4 (seq 256, batch 2 a rank)",
                   eight, "s", one, "the same job on 1 simulated GPU", note=f"last loss {loss:.3f}")]
