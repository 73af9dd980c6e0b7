"""A simulated GPU has a card's memory: the bytes of the tensors on it, counted whoever allocates them, answered as
CUDA's caching allocator answers, and CUDA's out-of-memory error past its capacity; NCCL's facts hold together.

One launch of tests/launch_scripts/simulated_memory.py on 2 hosts x 2 GPUs of 64 MiB; each test reads its part.
"""

import os

import pytest
from helpers import checklist_results

from meshsim import Topology
from meshsim.compat.simgpu.allocator import Allocator, OutOfMemory
from meshsim.compat.simgpu.gpus import CATALOGUE, GPUError, gpu_of
from meshsim.launch.launcher import launch
from meshsim.launch.options import LaunchError, LaunchOptions

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_scripts")
MiB = 1 << 20


@pytest.fixture(scope="module")
def checks():
    result = launch(os.path.join(SCRIPTS, "simulated_memory.py"), Topology(2, 2), deadline=240, gpu=str(64 * MiB))
    assert result.passed, result.report()
    return checklist_results(result)


def test_fsdp_and_fsdp_tp_training_holds_parameters_gradients_and_two_adam_states_on_each_rank(checks):
    for rank in checks:
        for name, figures in rank["fsdp_and_tp_memory_is_parameters_gradients_and_adam_states"].items():
            assert figures["measured"] == figures["arithmetic"], (name, figures)
            assert figures["peak_above"] > figures["measured"], (name, figures)  # unsharded parameters, activations
            assert figures["left"] == 0, (name, figures)  # everything freed with the model and optimizer


def test_a_block_is_rounded_to_512_bytes_in_cudas_segments_and_the_cache_is_released_by_empty_cache(checks):
    for rank in checks:
        figures = rank["allocator_arithmetic"]
        new_small_segment = 0 if figures["small_segment_cached"] else 2 * MiB
        assert figures["during"] == [4096 + 3 * MiB, new_small_segment + 20 * MiB]
        assert figures["after"] == [0, new_small_segment + 20 * MiB, 4096 + 3 * MiB]
        assert figures["emptied"] == 0
        assert figures["free_plus_reserved"] == figures["total"] == 64 * MiB
        assert figures["properties"] == [64 * MiB, "meshsim simulated GPU"] and figures["summary"]


def test_a_copy_naming_the_cpu_that_a_gpu_tensor_reports_stays_on_its_gpu(checks):
    for rank in checks:  # 1,000 bfloat16 elements: a 2,048-byte block; none for a host tensor's copy
        assert rank["copies_that_name_their_own_device"] == {"type_as": 2048, "to_own_device": 2048,
                                                            "host_type_as": 0}


def test_views_in_place_operators_and_host_copies_allocate_nothing_and_new_results_their_block(checks):
    for rank in checks:  # 64 x 64 float32: 16 KiB; an out= host buffer that GPU inputs write becomes GPU memory
        assert rank["each_operator_counted_by_what_it_allocates"] == {
            "views": 0, "in_place": 0, "copy_to_host": 0, "host_op": 0, "new_result": 16384,
            "out_into_host_buffer": 16384, "resize_": 16384, "steps_level": True}


def test_memory_stats_has_the_keys_training_stacks_read(checks):
    keys = set(checks[0]["allocator_arithmetic"]["keys"])
    assert {"active_bytes.all.peak", "reserved_bytes.all.peak", "num_alloc_retries", "num_ooms"} <= keys


def test_an_allocation_past_the_capacity_is_cudas_out_of_memory_error_naming_the_rank(checks):
    for rank, results in enumerate(checks):
        oom = results["out_of_memory_as_cuda"]
        assert oom["error"].startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 100.00 MiB. GPU 0 "
                                       "has a total capacity of 64.00 MiB")
        assert f"(meshsim: rank {rank}, simulated GPU 0" in oom["error"]
        assert oom["derived"] == "OutOfMemoryError: CUDA out of memory"  # empty_like of a GPU tensor: derived
        assert oom["ooms"] == 2 and oom["retries"] and oom["still_usable"] == 4.0


def test_a_group_bound_to_a_device_takes_per_group_timeouts_and_device_barriers(checks):
    assert [rank["bound_device_and_timeouts"] for rank in checks] == [
        [f"cuda:{local}", True, True] for local in (0, 1, 0, 1)]


def test_every_nccl_reduce_op_works_on_every_path(checks):
    for rank, results in enumerate(checks):
        ops = results["reduce_ops_as_on_nccl"]
        assert ops["SUM"] == [10.0] * 2 and ops["AVG"] == [2.5] * 2 and ops["PRODUCT"] == [24.0] * 2
        assert ops["MIN"] == [1.0] * 2 and ops["MAX"] == [4.0] * 2 and ops["PREMUL_SUM"] == [5.0] * 2
        assert ops["reduce_scatter_premul"] == [2.0 * rank, 2.0 * rank + 1] and ops["input_unchanged"]
        assert ops.get("reduce_scatter_single_premul", ops["reduce_scatter_premul"]) == ops["reduce_scatter_premul"]
        assert ops["functional_avg"] == [1.5] * 2 and ops["c10d_functional_reduce_scatter_avg"] == [1.5] * 2


def test_the_allocator_model_reserves_segments_retries_then_refuses_past_its_limit():
    books = Allocator(0, 64 * MiB)
    assert books.allocate(100) == 512 and books.reserved == 2 * MiB
    big = books.allocate(30 * MiB)
    assert big == 30 * MiB and books.reserved == 32 * MiB
    books.free(30 * MiB)
    assert books.reserved == 32 * MiB and books.allocated == 512  # cached, not released
    books.allocate(40 * MiB)  # the cached 30 MiB cannot hold it; releasing them makes room: a retry
    assert books.memory_stats()["num_alloc_retries"] == 1 and books.reserved == 42 * MiB
    with pytest.raises(OutOfMemory, match=r"Tried to allocate 30.00 MiB. GPU 0 has a total capacity of 64.00 MiB"):
        books.allocate(30 * MiB)
    stats = books.memory_stats()
    assert stats["num_ooms"] == 1 and stats["allocated_bytes.all.peak"] == 40 * MiB + 512
    books.reset_peaks()
    assert books.memory_stats()["allocated_bytes.all.peak"] == books.allocated == 40 * MiB + 512


def test_gpu_names_a_card_or_its_bytes_and_anything_else_is_one_line():
    assert gpu_of(None) is CATALOGUE["h100-80gb"] and gpu_of("A100-40GB").total_memory == 40339 * MiB
    assert gpu_of("2e9").total_memory == 2_000_000_000 and gpu_of(123456).total_memory == 123456
    for bad in ("h100", "-5", "0"):
        with pytest.raises(GPUError, match="expected one of h100-80gb, a100-40gb"):
            gpu_of(bad)
    with pytest.raises(LaunchError, match="--gpu tpu-v5"):
        LaunchOptions(gpu="tpu-v5")


def test_host_copies_and_transfers_are_their_own_memory_as_on_a_gpu(checks):
    for rank in checks:  # 1,024 float32: a 4 KiB block
        assert rank["host_copies_are_their_own_memory"] == {
            "written": 1024.0, "itself": [True, True, True], "freed": 0, "host_values": 2048.0,
            "pinned": [True, True, False], "transfer": [0.0, 4096]}
