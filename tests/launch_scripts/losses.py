"""Run a training script as __main__, unmodified, and record on every rank the loss of each backward() it makes.

    losses.py OUT_DIR SCRIPT [ARGS...]

The same harness runs under `meshsim launch` (simulated GPUs) and under `torchrun` (the script's CPU copy), so
the two runs' losses can be compared step by step. A loss is the value of the tensor backward() is called on
(its local value for a DTensor); OUT_DIR/rank<RANK>.json holds them, in order, written when the script ends.

A fresh process draws a random seed (torch 2.13 seeds each process's CPU generator anew), and most examples do not
seed before building their model; both runs therefore start rank r's generators at LOSSES_SEED + r (default 1234):
the same on both sides, different across ranks, as fresh processes are.
"""

import json
import os
import runpy
import sys

import torch


def main() -> None:
    out_dir, script, *args = sys.argv[1:]
    losses: list[float] = []
    original = torch.Tensor.backward
    inside = []

    def backward(self, *a, **k):
        if inside:  # torch re-enters Tensor.backward through an active TorchFunctionMode: one call
            return original(self, *a, **k)
        value = self.detach()
        local = getattr(value, "to_local", None)
        losses.append(float((local() if local is not None else value).float().sum()))
        inside.append(True)
        try:
            return original(self, *a, **k)
        finally:
            inside.pop()

    torch.Tensor.backward = backward
    torch.manual_seed(int(os.environ.get("LOSSES_SEED", "1234")) + int(os.environ["RANK"]))
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.json"), "w") as fh:
            json.dump(losses, fh)
    if "meshsim" not in sys.modules:
        # The CPU twin, on plain torch, after a run that succeeded: its losses are written, and plain torch's
        # interpreter teardown aborted a twin now and then ("terminate called without an active exception", once
        # in four CI runs), which says nothing of the losses. Under meshsim launch the rank must end normally: it
        # tells the controller it finished.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
