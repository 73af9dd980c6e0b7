"""Every patch meshsim makes to torch fits the installed torch; one that does not is one line naming the torch
function and the release, before any rank runs user code (meshsim.compat)."""

import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.compat import Patch, problems, registered
from meshsim.core import releases as versions

PATCH_NAMES = sorted(registered())
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", PATCH_NAMES)
def test_every_patch_fits_the_installed_torch(name):
    assert problems(registered()[name]) == []


def test_every_patch_installs_on_the_installed_torch_in_a_fresh_process():
    code = ("from meshsim.compat import follow, memo, progress, simgpu, patching, tiers\n"
            "simgpu.install(4)\n"
            "memo.install()\n"
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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_remembered_layout_arithmetic_answers_as_torch_computes_it(sizes, data):
    """speed.layout-memo hands out torch's own answers: a layout's collapse, complement and cosize, and the
    ranks remap_to_tensor gives, equal what the unremembered methods compute for any mesh, its slices and its
    flattened dims (asked twice: the second answer is the remembered one)."""
    import torch

    from meshsim.compat import memo

    layouts = _flat_layouts()
    memo.install()
    mesh = layouts._MeshLayout.from_sizes_strides(tuple(sizes), tuple(int(math.prod(sizes[i + 1:]))
                                                                     for i in range(len(sizes))))
    start = data.draw(st.integers(0, len(sizes) - 1))
    end = data.draw(st.integers(start + 1, len(sizes)))
    asked = [mesh, layouts._MeshLayout(mesh[start:end].axes), mesh[start:end].collapse()]
    world = math.prod(sizes) * data.draw(st.sampled_from([1, 2]))
    for layout in asked:
        for owner in (type(layout),):
            for method, args in (("cosize", ()), ("complement", (world,)), ("collapse", ())):
                remembered = vars(owner).get(method)
                if remembered is None:
                    continue
                own = remembered.__wrapped__(layout, *args)
                assert remembered(layout, *args) == own and remembered(layout, *args) == own
    ranks = torch.arange(world)
    torch_own = ranks.as_strided(*_strided(mesh, world)).reshape(-1, *mesh.top_level_sizes)
    assert torch.equal(mesh.remap_to_tensor(ranks), torch_own)
    assert layouts._MeshLayout.collapse._meshsim_memo


def test_remembered_layout_arithmetic_refuses_and_binds_as_torch_does():
    """Keywords bind as torch's method binds them, and an argument of another type is not answered from an
    equal one's memory (complement(8.0) raises in torch whether or not complement(8) was asked first)."""
    from meshsim.compat import memo

    layouts = _flat_layouts()
    memo.install()
    flat = layouts._FlatLayout((4,), (1,))
    assert flat.complement(world_size=8) == flat.complement(8) == layouts._FlatLayout.complement.__wrapped__(flat, 8)
    with pytest.raises(TypeError):
        flat.complement(8.0)


def _strided(layout, world):
    """remap_to_tensor's own as_strided arguments, from the unremembered methods."""
    flat = type(layout).collapse.__wrapped__(layout)
    outer = type(flat).complement.__wrapped__(flat, world)
    return outer.shape + flat.shape, outer.stride + flat.stride


def _flat_layouts():
    """torch's layout module where it has _FlatLayout (2.13 and later; the release matrix runs this file on 2.9.1,
    which has no layouts under DeviceMesh, and 2.10-2.12 keep _MeshLayout alone)."""
    layouts = pytest.importorskip("torch.distributed._mesh_layout")
    if not hasattr(layouts, "_FlatLayout"):
        pytest.skip("this torch's DeviceMesh has no _FlatLayout (before 2.13)")
    return layouts
