"""Pairwise reward-model training on a 3-D mesh (dp=2, cp=2, tp=2): sequences are split over cp,
the MLP over tp. Replicated-over-(dp, cp) weights are synced on the flattened dp x cp mesh, and
the tp leaders keep accuracy / duplicate-pair counters on the same flattened mesh.

Held back (written blind, outside meshsim's tests, 2026-11-28; right when measured, then wrong for one change (named
0, 2, 4 and 6): the ranks held in the flattened dp x cp all_reduce are one call ahead of rank 6 on it, which counts
alone cannot tell from an added call; a second culprit needs a line of its own too).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

DEV_PER_HOST = 4
HID, FF, SEQ, BATCH, STEPS = 16, 32, 8, 4, 5


def make_pair(dp_rank, step):
    g = torch.Generator().manual_seed(97 * step + dp_rank)
    chosen = torch.randn(BATCH, SEQ, HID, generator=g)
    rejected = torch.randn(BATCH, SEQ, HID, generator=g)
    if dp_rank == 1 and step == 2:
        # two responses that only differ in their first half (a common annotation artifact)
        rejected[0, SEQ // 2:] = chosen[0, SEQ // 2:]
    return chosen, rejected


def reduce_partial(partial, group):
    full = partial.detach().clone()
    dist.all_reduce(full, group=group)
    return partial + (full - partial).detach()


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    dpcp = mesh["dp", "cp"]._flatten("dpcp")
    tp_group, cp_group = mesh["tp"].get_group(), mesh["cp"].get_group()
    dp_rank, cp_rank, tp_rank = (mesh[d].get_local_rank() for d in ("dp", "cp", "tp"))
    torch.manual_seed(tp_rank)
    w1 = (torch.randn(HID, FF // 2) * 0.1).requires_grad_()
    w2 = (torch.randn(FF // 2) * 0.1).requires_grad_()
    opt = torch.optim.SGD([w1, w2], lr=0.05)
    chunk = slice(cp_rank * SEQ // 2, (cp_rank + 1) * SEQ // 2)

    def score(x):
        partial = torch.relu(x[:, chunk] @ w1).sum(1) @ w2
        return reduce_partial(reduce_partial(partial, tp_group), cp_group)

    for step in range(STEPS):
        chosen, rejected = make_pair(dp_rank, step)
        margin = score(chosen) - score(rejected)
        loss = -F.logsigmoid(margin).mean()
        opt.zero_grad()
        loss.backward()
        for p in (w1, w2):
            dist.all_reduce(p.grad, group=dpcp.get_group())
            p.grad /= dpcp.size()
        opt.step()
        if tp_rank == 0:
            dup = (chosen[:, chunk] == rejected[:, chunk]).flatten(1).all(1)
            counts = torch.tensor([(margin > 0).sum().item(), BATCH, dup.sum().item()], dtype=torch.float)
            if dup.any():
                # duplicated chunks: count each pair once per sequence
                dist.all_reduce(counts, group=mesh["cp"].get_group())
            else:
                dist.all_reduce(counts, group=dpcp.get_group())
            if dist.get_rank() == 0:
                print(f"step {step} loss {loss.item():.4f} acc {counts[0].item() / counts[1].item():.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
