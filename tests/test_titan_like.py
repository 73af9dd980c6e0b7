"""A torchtitan-like job (tests/launch_scripts/titan_like.py: meta-device init, TP x FSDP2 with bf16 mixed
precision, AdamW, torchtitan's memory monitor) trains on 2 hosts x 2 simulated GPUs, installing nothing, and its
simulated GPU memory agrees with torch's own estimator, FSDPMemTracker, on the same step."""

import json
import math
import os

import pytest

from meshsim import Topology
from meshsim.launch.launcher import launch

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_scripts", "titan_like.py")


@pytest.fixture(scope="module")
def ranks():
    result = launch(SCRIPT, Topology(2, 2), args=["2"], deadline=300)
    assert result.passed, result.report()
    found = []
    for output in result.outputs:
        (line,) = [line for line in output.splitlines() if line.startswith("RESULT ")]
        found.append(json.loads(line[len("RESULT "):]))
    return found


def test_tp_peers_see_the_same_loss_and_every_rank_the_same_gradient_norm(ranks):
    # mesh (dp, tp) = (2, 2): ranks 0-1 share a batch, ranks 2-3 another
    assert ranks[0]["losses"] == ranks[1]["losses"] and ranks[2]["losses"] == ranks[3]["losses"]
    assert ranks[0]["losses"] != ranks[2]["losses"]
    assert all(rank["grad_norms"] == ranks[0]["grad_norms"] for rank in ranks)
    assert all(math.isfinite(x) and 0 < x < 10 for rank in ranks for x in rank["losses"] + rank["grad_norms"])


def test_the_simulated_gpus_peak_is_within_ten_percent_of_fsdp_mem_trackers(ranks):
    for rank in ranks:
        memory = rank["memory"]
        assert abs(memory["meshsim_peak"] - memory["fsdp_mem_tracker_peak"]) <= 0.1 * memory["fsdp_mem_tracker_peak"]
        assert memory["reserved_peak"] >= memory["meshsim_peak"] and memory["ooms"] == memory["retries"] == 0


def test_between_steps_a_rank_holds_its_parameters_and_adams_two_states(ranks):
    for rank in ranks:
        memory = rank["memory"]
        assert memory["after"] >= 3 * memory["local_parameter_bytes"]
        assert memory["after"] <= 3 * memory["local_parameter_bytes"] + 256 * 1024  # + the last step's logits
