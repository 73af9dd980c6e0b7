"""Expert-parallel trainer resumed from a checkpoint. Expert pairs (new_subgroups of 2) average their
expert gradients; when warm-up ends the pair also averages its parameters once, so the two copies
start the main phase identical. Each node (new_subgroups of 4) all-gathers the router loads of its
ranks for load balancing; a rank whose loads did not change since the last step reuses the last
gathered result. Each rank reads its resume step from its own checkpoint shard."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import frcase  # noqa: E402

DIM, EXPERTS, POOL, STEPS, WARMUP_END, SEED = 8, 4, 10, 5, 1204, 107
SHARD_META = {r: {"step": 1200} for r in range(8)}
SHARD_META[7] = {"step": 1201}


def router_loads(step, rank):
    """Loads of the batch this rank draws from its (small, cached) pool of packed batches."""
    g = torch.Generator().manual_seed(SEED * 100 + step * 8 + rank)
    pick = int(torch.randint(0, POOL, (1,), generator=g))
    g = torch.Generator().manual_seed(rank * 1000 + pick)
    return torch.bincount(torch.randint(0, EXPERTS, (32,), generator=g), minlength=EXPERTS).float()


def main():
    rank = dist.get_rank()
    pair, _ = dist.new_subgroups(group_size=2)
    node, _ = dist.new_subgroups(group_size=4)
    torch.manual_seed(rank)
    w = torch.randn(DIM)
    step_no = SHARD_META[rank]["step"]
    last_loads, gathered = None, torch.zeros(4 * EXPERTS)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step * 8 + rank)
        grad = w - torch.randn(DIM, generator=g)
        dist.all_reduce(grad, group=pair)
        w -= 0.1 * grad / 2
        step_no += 1
        if step_no == WARMUP_END:
            dist.all_reduce(w, group=pair)
            w /= 2
        loads = router_loads(step, rank)
        if last_loads is None or not torch.equal(loads, last_loads):
            dist.all_gather_into_tensor(gathered, loads, group=node)
            last_loads = loads
        balance = gathered.view(4, EXPERTS).sum(0).std().reshape(1)
        dist.all_reduce(balance)
    dist.barrier()


if __name__ == "__main__":
    frcase.run(main)
