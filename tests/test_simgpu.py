"""Simulated GPUs hold wherever torch runs code: what a GPU script relies on, checked on 2 hosts x 2 simulated GPUs.

One launch of tests/launch_scripts/simulated_gpu.py runs every check on every rank; each test reads its part.
"""

import os

import pytest
from helpers import checklist_results

from meshsim import Topology
from meshsim.launch.launcher import launch

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_scripts")
ORDINAL = "AcceleratorError: CUDA error: invalid device ordinal (device 2; this simulated host has 2 GPUs, 0..1)"


@pytest.fixture(scope="module")
def checks():
    result = launch(os.path.join(SCRIPTS, "simulated_gpu.py"), Topology(2, 2), deadline=240)
    assert result.passed, result.report()
    return checklist_results(result)


def test_cuda_initializes_lazily_and_device_mesh_sets_each_ranks_local_gpu(checks):
    assert [rank["lazy_init_then_device_mesh_sets_local_rank"] for rank in checks] == [
        [False, local, True] for local in (0, 1, 0, 1)]


def test_every_device_argument_form_places_data_in_cpu_memory(checks):
    for local, rank in zip((0, 1, 0, 1), checks):
        forms = rank["device_forms"]
        assert set(forms["placed"].values()) == {"cpu"} and len(forms["placed"]) == 12
        assert forms["device_int"] == f"cuda:{local}"  # torch.device(i) is the GPU; tensors report cpu
        assert forms["loads"] == [[2.0, 2.0, 2.0]] * 5  # map_location str, bare, dict, torch.device, callable


def test_an_ordinal_the_host_lacks_fails_as_cuda_does_in_every_form(checks):
    for rank in checks:
        assert rank["invalid_ordinals"] == dict.fromkeys(
            ("set_device", "to", "cuda", "zeros", "module_to", "accelerator", "load", "ddp"), ORDINAL)


def test_device_index_contexts_set_and_restore_the_current_gpu(checks):
    assert [rank["device_index_contexts"] for rank in checks] == [[1, 0, 1, 0], [1, 1, 1, 1]] * 2


def test_optimizers_take_the_same_steps_with_foreach_fused_and_capturable(checks):
    for rank in checks:
        for optimizer, differences in rank["optimizer_flags_agree"].items():
            assert len(differences) == (3 if optimizer == "SGD" else 4)
            assert max(differences.values()) < 1e-5, (optimizer, differences)


def test_fsdp1_on_simulated_gpus_trains_as_a_local_model_sharded_and_hybrid(checks):
    for rank in checks:
        differences = rank["fsdp1_trains_as_a_local_model"]
        assert set(differences) == {"full_shard", "hybrid_shard"}
        assert max(differences.values()) < 1e-6, differences


def test_a_rank_starts_dataloader_workers_by_the_platforms_default_method(checks):
    import multiprocessing

    for rank in checks:
        assert rank["dataloader_workers"] == [28.0, multiprocessing.get_all_start_methods()[0]]


def test_dtensor_random_init_agrees_on_replicas_differs_across_shards_and_keeps_ranks_in_step(checks):
    for rank in checks:
        random_init = rank["dtensor_random_init"]
        assert random_init["repeat_equal"] and random_init["states_equal"]
        # mesh (dp, tp) = (2, 2), placements [Replicate(), Shard(0)]: ranks 0 and 2 hold shard 0, 1 and 3 shard 1
        first, second, third, fourth = random_init["locals"]
        assert first == third and second == fourth and first != second


def test_autocast_cuda_computes_in_bf16_and_reports_as_on_a_gpu(checks):
    for rank in checks:
        assert rank["autocast_bf16"] == {"inside": ["torch.bfloat16", True, "torch.bfloat16"],
                                         "disabled": "torch.float32", "legacy": "torch.bfloat16",
                                         "after": "torch.float32"}


def test_grad_scaler_for_cuda_scales_and_steps(checks):
    assert all(rank["grad_scaler_steps"] == {"scale": 8.0, "moved": True} for rank in checks)


def test_dtensor_attention_sharded_on_heads_equals_plain_attention_forward_and_backward(checks):
    for rank in checks:
        assert rank["dtensor_attention_matches_plain"]["out"] < 1e-5
        assert rank["dtensor_attention_matches_plain"]["grad_q"] < 1e-5


def test_nccl_groups_count_elements_where_gloo_compares_shapes(checks):
    contract = checks[1]["nccl_contract"]
    assert contract["zero_d"] == [[0.0], [1.0], [2.0], [3.0]]
    assert contract["reshaped"] == [[float(r)] * 4 for r in range(4)]
    assert contract["uneven"] == [[float(r)] * (r + 1) for r in range(4)]
    assert contract["stacked"] == [[float(r)] * 2 for r in range(4)]
    assert contract["scattered"] == [4.0, 4.0] and contract["premul"] == [2.0, 2.0]


def test_a_send_and_recv_whose_tags_differ_pair_on_nccl_groups_and_gloo_groups_pair_by_tag(checks):
    """NCCL ignores p2p tags (pytorch#94819): a script whose tags disagree runs on GPUs, and must not hang here."""
    assert checks[1]["nccl_contract"]["untagged"] == {"nccl": [1.0, 1.0], "gloo": [[1.0, 1.0], [2.0, 2.0]]}
    assert checks[3]["nccl_contract"]["untagged"] == {"nccl": [3.0, 3.0], "gloo": [[3.0, 3.0], [6.0, 6.0]]}


def test_nccl_groups_refuse_non_contiguous_tensors_and_gloo_groups_keep_gloos_contract(checks):
    contract = checks[0]["nccl_contract"]
    assert contract["non_contiguous"] == "ValueError: Tensors must be contiguous"
    assert "ProcessGroupGloo::allgather: invalid tensor size" in contract["gloo_group_keeps_gloo"]


def test_unsimulated_cuda_apis_raise_simulated_gpu_error_naming_the_api(checks):
    for api, error in checks[0]["unsimulated_apis_raise"].items():
        assert error.startswith(f"SimulatedGPUError: {api}:"), (api, error)
        assert ("--training.disable_cuda_graphs" in error) == ("graph" in api.lower()), (api, error)


def test_streams_and_events_are_synchronous(checks):
    assert checks[0]["streams_and_events"] == [False, True, False, [2.0, 2.0]]


def test_a_new_stream_is_its_own_and_events_time_the_work_between_them_as_cuda_events_do(checks):
    for rank in checks:
        timed = rank["streams_are_distinct_and_events_timed"]
        assert timed["streams"] == [True, True, True, True, True]
        assert timed["elapsed"] == [True, True, True]
        assert timed["untimed"] == "RuntimeError: Both events must be created with argument 'enable_timing=True'."
        assert timed["unrecorded"] == "RuntimeError: Both events must be recorded before calculating elapsed time."


def test_the_card_reports_its_own_name_and_l2_and_nccl_a_version(checks):
    for local, rank in zip((0, 1, 0, 1), checks):
        assert rank["card_facts_and_nccl_version"] == {
            "name": "NVIDIA H100 80GB HBM3", "l2": 50 << 20, "device_of": 1 - local,
            "nccl": [[2, 27, 5], 22705, True], "allocator_settings": None}


def test_sdpa_forced_onto_cudas_efficient_or_cudnn_kernel_runs_and_cleanup_calls_answer(checks):
    for rank in checks:
        assert rank["forced_cuda_attention_kernels_and_cleanup"] == {
            "EFFICIENT_ATTENTION": [True, True], "CUDNN_ATTENTION": [True, True]}


def test_torch_compile_runs_eagerly_on_simulated_gpus_and_rank_0_says_so_once():
    """torch skips every frame it would compile under the dispatch mode that counts GPU memory: a silent eager run
    would pass for a compiled one, so rank 0 says it, once, whatever compiles how often."""
    result = launch(os.path.join(SCRIPTS, "compiled.py"), Topology(1, 2), deadline=60)
    assert result.passed, result.report()
    said = [state.output.count("torch.compile runs eagerly here") for state in result.record.states]
    assert said == [1, 0], [state.output for state in result.record.states]
