"""Model tier: every rank of a 102,400-rank 5-D layout and of 1,048,576 ranks predicted and judged, each in a fresh
process (its peak memory is the controller's), next to the same plan predicted rank by rank (a sample, extrapolated);
a hang at a million ranks (one rank skips a collective); and the size of the --json report."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from figures import Figure, goal

CASES = {  # name: (dims, seconds goal, memory goal MB or None)
    "102,400 ranks, 5-D layout": ((("pp", 16), ("dp_replicate", 4), ("dp_shard", 25), ("cp", 8), ("tp", 8)), 2.0, 300),
    "1,048,576 ranks, 5-D layout": ((("pp", 16), ("dp_replicate", 8), ("dp_shard", 64), ("cp", 16), ("tp", 8)), 30.0,
                                    None),
}

MEASURE = """
import json, sys, time

def peak_mb():  # VmHWM: this process's own peak (ru_maxrss carries the parent's across fork and exec)
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024
from meshsim import Cluster, Plan, Topology, step
from meshsim.model.predict import predict
dims, hang = json.loads(sys.argv[1]), sys.argv[2] == "hang"
shape, names = [s for _, s in dims], [n for n, _ in dims]
steps = [step("init_device_mesh", out="m", shape=shape, names=names),
         step("query", mesh="m", what="get_all_groups"), step("query", mesh="m", what="get_coordinate"),
         step("check", mesh="m")]
if hang:
    steps.insert(1, step("all_reduce", mesh="m", dim=names[1], skip_on=[123457]))
plan = Plan(tuple(steps))
world = 1
for s in shape:
    world *= s
base = peak_mb()
with Cluster(Topology(world // 8, 8), tier="model") as cluster:
    started = time.monotonic()
    result = cluster.run(plan)
    seconds = time.monotonic() - started
size = len(json.dumps(result.to_json()))
peak = peak_mb()
from meshsim.model.predict import _run_rank
from meshsim.spec.platform import CPU
started, sample = time.monotonic(), 256
for r in range(0, world, world // sample):
    _run_rank(plan, r, world, CPU)
per_rank = (time.monotonic() - started) / sample
print(json.dumps({"seconds": seconds, "peak_mb": peak, "import_mb": base, "json": size, "outcome": result.outcome,
                  "culprits": result.culprits[:5], "classes": len(result.prediction.classes or [0]),
                  "per_rank": per_rank, "world": world}))
"""


def _measure(dims: tuple, hang: bool = False) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(MEASURE), json.dumps(dims), "hang" if hang else ""],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[Figure]:
    figures = []
    for name, (dims, seconds, memory) in CASES.items():
        m = _measure(dims)
        anchor = m["per_rank"] * m["world"]
        note = f"{m['classes']} classes; {m['outcome']}"
        figures.append(goal(Figure("model", name, m["seconds"], "s", anchor, "rank by rank, extrapolated",
                                   note=note), lambda f, s=seconds: f.value <= s, f"<= {seconds:g} s"))
        if memory is not None:
            figures.append(goal(Figure("model", f"{name}: controller peak memory", m["peak_mb"], "MB",
                                       m["import_mb"], "after imports"),
                                lambda f, mb=memory: f.value <= mb, f"<= {memory} MB"))
        else:
            figures.append(goal(Figure("model", f"{name}: --json size", m["json"] / 1e6, "MB"),
                                lambda f: f.value <= 1.0, "<= 1 MB"))
    dims = CASES["1,048,576 ranks, 5-D layout"][0]
    hung = _measure(dims, hang=True)
    figures.append(goal(Figure("model", "1,048,576 ranks, rank 123457 skips a collective", hung["seconds"], "s",
                               note=f"{hung['outcome']}, culprits {hung['culprits']}, "
                                    f"JSON {hung['json'] / 1e3:.0f} kB"),
                        lambda f: hung["outcome"] == "hang" and hung["culprits"] == [123457] and f.value <= 30,
                        "hang, culprit 123457, <= 30 s"))
    return figures
