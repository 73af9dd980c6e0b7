"""Context parallelism's ring attention on simulated GPUs: CUDA's attention operators, computed with the CPU's
kernel, give what plain attention over the whole sequence gives.

One launch of tests/launch_scripts/ring_attention.py on a host of 4 simulated GPUs (a 1-D mesh of 4) runs every
check on every rank; each test reads its part. Differences are relative to the largest magnitude.
"""

import os

import pytest
import torch
from helpers import checklist_results
from torch.nn.attention import SDPBackend, sdpa_kernel

from meshsim import Topology
from meshsim.compat.simgpu.attention import cuda_backend
from meshsim.launch.launcher import launch

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_scripts")
FLOAT32 = 1e-5  # float32 sums in another order
BFLOAT16 = 2e-2  # a bfloat16 output rounds to 8 bits of mantissa


@pytest.fixture(scope="module")
def checks():
    result = launch(os.path.join(SCRIPTS, "ring_attention.py"), Topology(1, 4), deadline=120)
    assert result.passed, result.report()
    return checklist_results(result)


@pytest.mark.parametrize("check", ["float32_causal_memory_efficient", "float32_causal_alltoall",
                                   "float32_not_causal"])
def test_ring_attention_in_float32_gives_plain_attentions_output_and_gradients(checks, check):
    for rank in checks:
        assert max(rank[check]) < FLOAT32, rank[check]


@pytest.mark.parametrize("check", ["bfloat16_causal_flash", "bfloat16_torchtitan_module_cudnn",
                                   "bfloat16_torchtitan_module_grouped_query"])
def test_ring_attention_in_bfloat16_through_flash_and_torchtitans_cudnn_gives_plain_attention(checks, check):
    for rank in checks:
        assert max(rank[check]) < BFLOAT16, rank[check]


def test_cuda_attention_operators_return_their_meta_shapes_and_the_math_of_attention(checks):
    for rank in checks:
        found = rank["cuda_operators_give_the_cpu_math"]
        for name, tolerance in [("flash", BFLOAT16), ("efficient", FLOAT32), ("cudnn", BFLOAT16)]:
            assert found[name]["shapes_as_meta"], name
            assert max(found[name]["out"], found[name]["lse"], *found[name]["grads"]) < tolerance, found[name]


def test_a_cuda_attention_operator_refuses_a_dtype_its_kernel_does_not_take(checks):
    assert checks[0]["cuda_operators_give_the_cpu_math"]["float64_flash"] == (
        "RuntimeError: aten._scaled_dot_product_flash_attention: CUDA's kernel takes float16, bfloat16, not float64")


def test_ring_attention_refuses_in_one_line_where_cuda_would_take_the_math_kernel_and_for_dropout(checks):
    for rank in checks:
        math, dropout = rank["float32_with_torchtitans_backends_refuses"], rank["dropout_refuses"]
        assert math.startswith("SimulatedGPUError: scaled_dot_product_attention under context parallelism: ")
        assert "float32" in math and "math kernel" in math and "\n" not in math
        assert dropout.startswith("SimulatedGPUError: aten._scaled_dot_product_efficient_attention: dropout")
        assert "Philox" in dropout and "\n" not in dropout


def test_sdpa_picks_the_cuda_operator_cuda_picks_by_priority_dtype_and_mask():
    float32, bfloat16 = torch.empty(0), torch.empty(0, dtype=torch.bfloat16)
    assert [cuda_backend(float32, None), cuda_backend(bfloat16, None)] == ["efficient", "flash"]
    assert cuda_backend(bfloat16, torch.ones(1, dtype=torch.bool)) == "efficient"  # flash takes no mask
    titan = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel(titan, set_priority=True):
        assert [cuda_backend(bfloat16, None), cuda_backend(float32, None)] == ["cudnn", None]
    with sdpa_kernel([SDPBackend.MATH]):
        assert cuda_backend(bfloat16, None) is None


def test_flex_attention_runs_eagerly_on_a_simulated_gpu_as_the_math_of_attention(checks):
    for rank in checks:
        found = rank["flex_attention_runs_eagerly_as_attention"]
        assert found["apart"] < FLOAT32 and found["counted"] and max(found["grads"]) < FLOAT32, found
        assert found["host_backward"].startswith("NotImplementedError: FlexAttention does not support backward"), found


def test_flex_attention_under_context_parallelism_gives_full_flex_attentions_output_and_gradients(checks):
    for rank in checks:
        assert max(rank["flex_context_parallel_gives_full_flex_attention"]) < FLOAT32, rank
