"""The recipe's examples. Functions named rank_* run on every rank; the rest runs in the controller."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.deadlines import EXAMPLE_S
from ..core.outcome import PASS
from ..model import torch_side
from ..model.predict import predict
from ..spec.plan import Plan, step

TOPOLOGY = (2, 4)
STEPS, LR = 4, 0.1
RTOL, ATOL = 1e-4, 1e-5


@dataclass
class ExampleResult:
    name: str
    passed: bool
    detail: str
    seconds: float
    facts: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"example": self.name, "passed": self.passed, "detail": self.detail,
                "seconds": round(self.seconds, 2), **self.facts}


def model_groups(shape: list[int], names: list[str], world: int, slices: dict[str, list[str]] | None = None
                 ) -> dict[str, list[list[int]]]:
    """What the reference model says each rank's group is along each named dim (of the mesh or its slices)."""
    steps_ = [step("init_device_mesh", shape=shape, names=names, out="m")]
    for handle, dims in (slices or {}).items():
        steps_.append(step("slice", src="m", names=dims, out=handle))
    queries = []
    for handle, dims in [("m", names)] + list((slices or {}).items()):
        for dim in dims:
            queries.append((f"{handle}[{dim}]" if handle != "m" else dim, len(steps_)))
            steps_.append(step("query", mesh=handle, what="get_group", dim=dim))
    pred = predict(Plan(tuple(steps_)), world)
    return {label: [torch_side(pred.ranks[r].observations[i]) for r in range(world)] for label, i in queries}


# --------------------------------------------------------------------------------------------- 2-D setup

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def two_d_setup_as_printed(deadline: float) -> tuple[bool, str, dict]:
    """The recipe's 2d_setup.py, unchanged (torch.cuda.device_count() and set_device(rank) included), launched
    as torchrun would on 1 host x 8 GPUs and on 2 hosts x 4 GPUs (simulated GPUs, one host's view each)."""
    from ..judge.report import group_map, grouped_tracebacks
    from ..launch.launcher import launch
    from ..spec.topology import Topology

    script = os.path.join(SCRIPTS, "2d_setup.py")
    one_host = launch(script, Topology(1, 8), deadline=deadline)
    if not one_host.passed:
        return False, "on 1 host x 8 GPUs the recipe's script should run: " + one_host.report(), {}
    made = sorted(sorted(ranks) for _, ranks, _, _ in group_map(one_host.record, one_host.topology)[0])
    expected = model_groups([2, 4], ["replicate", "shard"], 8)
    wanted = sorted({tuple(g) for dim in ("shard", "replicate") for g in expected[dim]})
    if [tuple(g) for g in made] != wanted:
        return False, f"on 1 host x 8 the hand-made groups {made} differ from DeviceMesh's (the model's) {wanted}", {}
    two_hosts = launch(script, Topology(2, 4), deadline=deadline)
    failures = grouped_tracebacks(two_hosts)
    broke = [ranks for ranks, title, _ in failures if "invalid device ordinal" in title]
    if two_hosts.passed or broke != [[4, 5, 6, 7]]:
        return False, "on 2 hosts x 4 GPUs ranks 4-7 should fail at torch.cuda.set_device(rank): " + \
            two_hosts.report(), {}
    return True, ("finding recipe-2d-setup-single-host: on 1 host x 8 the hand-made shard and replicate groups "
                  "equal DeviceMesh's (2, 4) groups; on 2 hosts x 4, as on real hardware, ranks 4-7 fail at "
                  "2d_setup.py:13 torch.cuda.set_device(rank) with invalid device ordinal (each host has 4 GPUs), "
                  "so the note that the snippet 'can also be used when running on multi hosts setup' is wrong"), \
        {"finding": "recipe-2d-setup-single-host", "failed_ranks": broke[0]}


# --------------------------------------------------------------------------------------------- HSDP

def _toy_model() -> Any:
    import torch.nn as nn

    class ToyModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net1 = nn.Linear(10, 10)
            self.relu = nn.ReLU()
            self.net2 = nn.Linear(10, 5)

        def forward(self, x: Any) -> Any:
            return self.net2(self.relu(self.net1(x)))

    return ToyModel()


def _toy_batch(step_: int, world: int) -> tuple[Any, Any]:
    """The global batch of a step: 4 rows per data-parallel rank, deterministic."""
    import torch

    g = torch.Generator().manual_seed(1000 + step_)
    return torch.randn(4 * world, 10, generator=g), torch.randn(4 * world, 5, generator=g)


def rank_hsdp(flavour: str) -> dict:
    """The recipe's ToyModel under hybrid sharding on a (2, 4) mesh, trained on fixed synthetic data."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh_2d = init_device_mesh("cpu", (2, 4), mesh_dim_names=("replicate", "shard"))
    model = _toy_model()
    if flavour == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=mesh_2d)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy

        model = FSDP(model, device_mesh=mesh_2d, sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                     device_id=torch.device("cpu"))
    local = _local_shards(model, flavour)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step_ in range(STEPS):
        x, y = _toy_batch(step_, world)
        mine = slice(4 * rank, 4 * rank + 4)
        loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"local": local, "full": _full_state(model, flavour)}


def _local_shards(model: Any, flavour: str) -> dict:
    """What this rank holds of each parameter, before training."""
    if flavour == "fsdp2":
        return {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _full_state(model: Any, flavour: str) -> dict:
    if flavour == "fsdp2":
        return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model):
        return {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone() for n, p in model.named_parameters()}


def reference_hsdp(world: int) -> dict:
    """The same model, data and optimizer in one process: the whole global batch each step."""
    import torch

    torch.manual_seed(0)
    model = _toy_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step_ in range(STEPS):
        x, y = _toy_batch(step_, world)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def check_hsdp(values: list[dict], world: int, flavour: str) -> tuple[bool, str, dict]:
    import torch

    reference = reference_hsdp(world)
    hosts, per_host = TOPOLOGY
    worst = 0.0
    for rank, value in enumerate(values):
        for name, tensor in value["full"].items():
            if not torch.allclose(tensor, reference[name], rtol=RTOL, atol=ATOL):
                return False, f"rank {rank} {name} differs from single-process training by " \
                              f"{(tensor - reference[name]).abs().max():.2e}", {}
            worst = max(worst, float((tensor - reference[name]).abs().max()))
    sharded = _sharding_facts(values, hosts, per_host)
    if not sharded["sharded_within_host"] or not sharded["replicated_across_hosts"]:
        return False, f"parameters are not laid out as HSDP should: {sharded}", sharded
    return True, (f"{flavour}: each parameter is split across the 4 ranks of a host and identical across the 2 "
                  f"hosts; after {STEPS} SGD steps every rank's full parameters equal single-process training "
                  f"(max |diff| {worst:.1e})"), dict(sharded, max_abs_diff=worst)


def _sharding_facts(values: list[dict], hosts: int, per_host: int) -> dict:
    """Within a host the 4 ranks hold different pieces that together cover every parameter; across hosts,
    ranks with the same local rank hold identical pieces."""
    import torch

    full = sum(t.numel() for t in values[0]["full"].values())
    within = across = True
    for host in range(hosts):
        pieces = [values[host * per_host + i]["local"] for i in range(per_host)]
        sizes = [sum(t.numel() for t in p.values()) for p in pieces]
        within &= all(size < full for size in sizes) and sum(sizes) >= full
        within &= any(any(not torch.equal(pieces[0][n], p[n]) for n in p) for p in pieces[1:])
    for local in range(per_host):
        same = [values[h * per_host + local]["local"] for h in range(hosts)]
        across &= all(all(torch.equal(same[0][n], p[n]) for n in p) for p in same[1:])
    return {"sharded_within_host": bool(within), "replicated_across_hosts": bool(across),
            "parameters": full, "held_per_rank": sum(t.numel() for t in values[0]["local"].values())}


# --------------------------------------------------------------------------------------------- 3-D

def rank_three_d() -> dict:
    """The recipe's custom-parallelism example, verbatim but for the device type."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh_3d = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("replicate", "shard", "tp"))
    hsdp_mesh = mesh_3d["replicate", "shard"]
    tp_mesh = mesh_3d["tp"]
    replicate_group = hsdp_mesh["replicate"].get_group()
    shard_group = hsdp_mesh["shard"].get_group()
    tp_group = tp_mesh.get_group()
    return {label: dist.get_process_group_ranks(g) for label, g in
            (("hsdp[replicate]", replicate_group), ("hsdp[shard]", shard_group), ("tp", tp_group))}


def check_three_d(values: list[dict], world: int) -> tuple[bool, str, dict]:
    expected = model_groups([2, 2, 2], ["replicate", "shard", "tp"], world, {"hsdp": ["replicate", "shard"]})
    wanted = {"hsdp[replicate]": expected["hsdp[replicate]"], "hsdp[shard]": expected["hsdp[shard]"],
              "tp": expected["tp"]}
    for rank, value in enumerate(values):
        for label, groups in wanted.items():
            if value[label] != groups[rank]:
                return False, f"rank {rank} {label}: torch {value[label]}, model {groups[rank]}", {}
    return True, "mesh_3d['replicate', 'shard'] and mesh_3d['tp'] groups equal the model's on all 8 ranks", {}


# --------------------------------------------------------------------------------------------- DDP

def _quickstart_network() -> Any:
    import torch.nn as nn

    class NeuralNetwork(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.flatten = nn.Flatten()
            self.linear_relu_stack = nn.Sequential(nn.Linear(28 * 28, 512), nn.ReLU(), nn.Linear(512, 512),
                                                   nn.ReLU(), nn.Linear(512, 10))

        def forward(self, x: Any) -> Any:
            return self.linear_relu_stack(self.flatten(x))

    return NeuralNetwork()


def _fashion_batch(step_: int, size: int) -> tuple[Any, Any]:
    """A FashionMNIST-shaped batch (N, 1, 28, 28) with labels 0..9, deterministic per step."""
    import torch

    g = torch.Generator().manual_seed(2000 + step_)
    return torch.rand(size, 1, 28, 28, generator=g), torch.randint(0, 10, (size,), generator=g)


def rank_ddp_replicate() -> dict:
    """The quickstart's NeuralNetwork, data-parallel over the 'replicate' dim of a (2, 4) mesh."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    mesh_2d = init_device_mesh("cpu", (2, 4), mesh_dim_names=("replicate", "shard"))
    replicas = mesh_2d.size(0)
    index = mesh_2d.get_local_rank("replicate")
    model = DDP(_quickstart_network(), process_group=mesh_2d.get_group("replicate"))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-1)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_replica = 16
    for step_ in range(STEPS):
        x, y = _fashion_batch(step_, per_replica * replicas)
        mine = slice(per_replica * index, per_replica * (index + 1))
        loss = loss_fn(model(x[mine]), y[mine])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {n.replace("module.", "", 1): p.detach().clone() for n, p in model.named_parameters()}


def reference_ddp(replicas: int) -> dict:
    import torch

    torch.manual_seed(0)
    model = _quickstart_network()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-1)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step_ in range(STEPS):
        x, y = _fashion_batch(step_, 16 * replicas)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def check_ddp(values: list[dict], world: int) -> tuple[bool, str, dict]:
    import torch

    reference = reference_ddp(TOPOLOGY[0])
    worst = 0.0
    for rank, value in enumerate(values):
        for name, tensor in value.items():
            diff = float((tensor - reference[name]).abs().max())
            worst = max(worst, diff)
            if not torch.allclose(tensor, reference[name], rtol=RTOL, atol=ATOL):
                return False, f"rank {rank} {name} differs from single-process training by {diff:.2e}", {}
    return True, (f"DDP over each 'replicate' group (pairs [0,4], [1,5], ...): after {STEPS} steps every rank "
                  f"equals single-process training on the pair's data (max |diff| {worst:.1e})"), \
        {"max_abs_diff": worst}


# --------------------------------------------------------------------------------------------- running

# Examples run in the controller: they launch the recipe's scripts themselves (meshsim launch).
SCRIPT_EXAMPLES: dict[str, Callable[[float], tuple[bool, str, dict]]] = {
    "2-D setup without DeviceMesh (the script as printed)": two_d_setup_as_printed,
}
EXAMPLES: dict[str, tuple[Callable, tuple, Callable]] = {
    "HSDP with FSDP HYBRID_SHARD": (rank_hsdp, ("fsdp1",), lambda v, w: check_hsdp(v, w, "fsdp1")),
    "HSDP with FSDP2 fully_shard": (rank_hsdp, ("fsdp2",), lambda v, w: check_hsdp(v, w, "fsdp2")),
    "3-D mesh: HSDP + TP slices": (rank_three_d, (), check_three_d),
    "DDP on the replicate dim": (rank_ddp_replicate, (), check_ddp),
}


def run_examples(cluster: Any, names: list[str] | None = None, deadline: float = EXAMPLE_S) -> list[ExampleResult]:
    results = []
    for name in names or list(SCRIPT_EXAMPLES):
        if name not in SCRIPT_EXAMPLES:
            continue
        started = time.monotonic()
        passed, detail, facts = SCRIPT_EXAMPLES[name](deadline)
        results.append(ExampleResult(name, passed, detail, time.monotonic() - started, facts))
    for name in names or list(EXAMPLES):
        if name not in EXAMPLES:
            continue
        fn, args, check = EXAMPLES[name]
        started = time.monotonic()
        run = cluster.run_fn(fn, *args, deadline=deadline)
        if run.outcome != PASS:
            results.append(ExampleResult(name, False, run.summary(), time.monotonic() - started))
            continue
        passed, detail, facts = check(run.values, cluster.world)
        results.append(ExampleResult(name, passed, detail, time.monotonic() - started, facts))
    return results
