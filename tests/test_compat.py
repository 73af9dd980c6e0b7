"""Every patch meshsim makes to torch fits the installed torch; one that does not is one line naming the torch
function and the release, before any rank runs user code (meshsim.compat)."""

import os
import subprocess
import sys

import pytest

from meshsim.compat import Patch, problems, registered
from meshsim.core import releases as versions

PATCH_NAMES = sorted(registered())
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", PATCH_NAMES)
def test_every_patch_fits_the_installed_torch(name):
    assert problems(registered()[name]) == []


def test_every_patch_installs_on_the_installed_torch_in_a_fresh_process():
    code = ("from meshsim.compat import follow, progress, simgpu, patching, tiers\n"
            "simgpu.install(4)\n"
            "follow.install(progress.Progress(lambda event: None))\n"
            "patching.install('fake.skip-non-member-groups', lambda: 0)\n"
            "patching.install('threaded.reduce-scatter-max-min')\n"
            "print(sorted(patching.PATCHES))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout.strip().splitlines()[-1]) == PATCH_NAMES


def _incompatible(**changes):
    patch = Patch("follow.device-mesh-on-purpose", "following meshes built",
                  ("torch.distributed.device_mesh.DeviceMesh._init_process_groups",), "2.10.0-2.15.0",
                  lambda: None)
    return Patch(**{**patch.__dict__, **changes})


def test_a_patch_that_reads_a_parameter_torch_no_longer_takes_is_one_line_naming_the_function_and_release():
    patch = _incompatible(needs={"torch.distributed.device_mesh.DeviceMesh._init_process_groups": ("rank_mapping",)})
    found = problems(patch)
    assert len(found) == 1
    assert "torch.distributed.device_mesh.DeviceMesh._init_process_groups" in found[0]
    assert f"torch {versions.installed_text()}" in found[0] and "rank_mapping" in found[0]


def test_a_patch_of_a_function_torch_no_longer_has_is_refused_unless_it_may_be_missing():
    gone = "torch.distributed.device_mesh.DeviceMesh._init_process_groups_v2"
    assert "does not exist in torch" in problems(_incompatible(targets=(gone,)))[0]
    assert problems(_incompatible(targets=(gone,), optional=(gone,))) == []


FUTURE_TORCH = """
import torch.distributed.device_mesh as device_mesh

def get_group(self, dimension=None):  # a torch whose DeviceMesh.get_group renamed its parameter
    return original(self, dimension)

original = device_mesh.DeviceMesh.get_group
device_mesh.DeviceMesh.get_group = get_group
"""


@pytest.mark.parametrize("command", [["run", "scenarios/01-recipe-2d-mesh.toml"],
                                     ["launch", "--nnodes", "2", "--nproc-per-node", "2",
                                      "meshsim/examples/scripts/2d_setup_with_device_mesh.py"]])
def test_a_torch_that_changed_a_patched_function_is_one_line_and_exit_2_before_any_user_code(tmp_path, command):
    (tmp_path / "sitecustomize.py").write_text(FUTURE_TORCH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "meshsim", *command], capture_output=True, text=True, timeout=300,
                         env=env, cwd=ROOT)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "torch.distributed.device_mesh.DeviceMesh.get_group" in lines[0] and "mesh_dim" in lines[0]
    assert versions.installed_text() in lines[0]
