"""Run a script (the first argument; the rest are its own) as __main__, as python would, and print on rank 0 the
median time between two optimizer steps ("STEP_MS ..."): the bench's per-step time, measured alike under
`meshsim launch` and torchrun. torch's global optimizer hook sees every optimizer's step, whoever makes it."""
import os
import runpy
import sys
import time

from torch.optim.optimizer import register_optimizer_step_post_hook

stamps: list[float] = []
register_optimizer_step_post_hook(lambda optimizer, args, kwargs: stamps.append(time.perf_counter()))
target = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(target))
try:
    runpy.run_path(target, run_name="__main__")
finally:
    if os.environ.get("RANK", "0") == "0" and len(stamps) > 2:
        gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
        print(f"STEP_MS {1000 * gaps[len(gaps) // 2]:.3f} over {len(gaps)} steps", flush=True)
