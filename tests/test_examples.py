"""The DeviceMesh recipe's examples run on the simulated 2x4 cluster and their checks can fail."""

import torch

from meshsim.examples import EXAMPLES, SCRIPT_EXAMPLES, run_examples
from meshsim.examples.recipe import (
    check_ddp,
    check_hsdp,
    check_three_d,
    model_groups,
)


def test_every_recipe_example_passes_on_a_simulated_2x4_cluster(meshsim_cluster):
    results = run_examples(meshsim_cluster)
    assert [r.name for r in results] == list(SCRIPT_EXAMPLES) + list(EXAMPLES)
    failed = [(r.name, r.detail) for r in results if not r.passed]
    assert not failed
    hsdp = [r for r in results if r.name.startswith("HSDP")]
    assert all(r.facts["sharded_within_host"] and r.facts["replicated_across_hosts"] for r in hsdp)
    assert all(r.facts["held_per_rank"] < r.facts["parameters"] for r in hsdp)
    two_d = results[0]
    assert two_d.facts == {"finding": "recipe-2d-setup-single-host", "failed_ranks": [4, 5, 6, 7]}


def test_the_model_gives_the_recipes_groups():
    groups = model_groups([2, 4], ["replicate", "shard"], 8)
    assert groups["shard"][5] == [4, 5, 6, 7] and groups["replicate"][5] == [1, 5]


def test_group_checks_fail_when_torch_gives_other_groups():
    three_d = [{"hsdp[replicate]": [0, 4], "hsdp[shard]": [0, 2], "tp": [0, 1]} for _ in range(8)]
    assert not check_three_d(three_d, 8)[0]


def test_training_checks_fail_when_parameters_drift():
    from meshsim.examples.recipe import reference_ddp, reference_hsdp

    good = reference_ddp(2)
    drifted = {n: t + (1e-3 if i == 0 else 0) for i, (n, t) in enumerate(good.items())}
    assert check_ddp([good] * 8, 8)[0]
    assert not check_ddp([good] * 7 + [drifted], 8)[0]
    full = reference_hsdp(8)
    unsharded = {"local": {n: t.clone() for n, t in full.items()}, "full": full}
    assert not check_hsdp([unsharded] * 8, 8, "fsdp2")[0]  # everyone holds everything: not HSDP
    assert torch.equal(full["net1.weight"], reference_hsdp(8)["net1.weight"])
