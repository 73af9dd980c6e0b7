"""Measuring torch's DeviceMesh and DTensor files inside the ranks with coverage.py: each rank records into its
own data file, saved after every plan (meshsim.sweep.coverage combines them and applies the reviewed exclusions).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

DEVICE_MESH = ("torch/distributed/device_mesh.py", "torch/distributed/_mesh_layout.py")
DTENSOR = ("torch/distributed/tensor/_redistribute.py", "torch/distributed/tensor/placement_types.py",
           "torch/distributed/tensor/_collective_utils.py", "torch/distributed/tensor/_utils.py",
           "torch/distributed/tensor/_api.py", "torch/distributed/tensor/_ops/_math_ops.py")
MODULES = DEVICE_MESH + DTENSOR


def targets() -> list[str]:
    """The files, where this Python's torch has them (without importing torch)."""
    spec = importlib.util.find_spec("torch")
    base = os.path.dirname(list(spec.submodule_search_locations or [""])[0]) if spec else ""
    return [os.path.join(base, module) for module in MODULES]


def start_in_rank(data_file: str) -> Any:
    """Begin measuring in a rank process; returns the Coverage object (save() it after each plan)."""
    import coverage

    cov = coverage.Coverage(data_file=data_file, data_suffix=True, branch=True, include=targets(),
                            config_file=False)
    cov.start()
    return cov


def measure_import(data_dir: str) -> None:
    """The ranks import torch before measuring starts (the forkserver preloads it), so the modules' import-time
    lines (imports, def and class statements) run unseen there; record them in a fresh process instead."""
    import subprocess
    import sys

    code = ("import sys; from meshsim.run.coverage import start_in_rank; cov = start_in_rank(sys.argv[1]); "
            "import torch.distributed.device_mesh, torch.distributed.tensor, torch.distributed.tensor._ops; "
            "cov.stop(); cov.save()")
    subprocess.run([sys.executable, "-c", code, os.path.join(data_dir, "rank")], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
