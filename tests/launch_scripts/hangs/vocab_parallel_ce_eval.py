"""Byte-level LM eval with context parallelism and a vocab-parallel cross entropy, on a (dp=2, cp=2, tp=2) mesh.
Each cp rank scores one half of the sequence; the output vocab (128 bytes) is split in halves across tp.

Held out (written blind, outside meshsim's tests, 2026-11-27):
vocab_parallel_ce_eval [3] (class 6, wrong mesh dim; mesh (2,2,2) dp x cp x tp). In batch 1 of replica 0, the second
cp half ("1-27 18:45:09.30") has no target byte in tp shard 1 (bytes 64-127), so only rank 3 takes the no-target
branch, which all-reduces the target logits on the cp group ({1, 3}) instead of tp ({2, 3}).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

VOCAB, DIM = 128, 32
LINES = {
    0: ["the quick brown fox jumps over it", "total paid 2024-11-27 18:45:09.30", "then the ledger was closed for it"],
    1: ["we met at noon by the old harbour", "they sailed east along the coast.", "and nobody saw them again at all."],
}


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    dp_rank, cp_rank, tp_rank = (mesh.get_local_rank(d) for d in ("dp", "cp", "tp"))
    tp_group = mesh.get_group("tp")
    shard = VOCAB // mesh.size(2)
    lo, hi = tp_rank * shard, (tp_rank + 1) * shard

    torch.manual_seed(0)
    embed = nn.Embedding(VOCAB, DIM)
    proj = nn.Linear(DIM, DIM)
    head_shard = nn.Parameter(torch.randn(VOCAB, DIM).div(DIM ** 0.5)[lo:hi])
    nll_sum, n_tokens = torch.zeros(1), torch.zeros(1)

    with torch.no_grad():
        for line in LINES[dp_rank]:
            ids = torch.tensor(list(line.encode()))
            x, y = ids[:-1], ids[1:]
            span = len(x) // mesh.size(1)
            x, y = x[cp_rank * span:(cp_rank + 1) * span], y[cp_rank * span:(cp_rank + 1) * span]
            logits = torch.tanh(proj(embed(x))) @ head_shard.T  # [span, VOCAB / tp]

            gmax = logits.max(-1).values
            dist.all_reduce(gmax, op=dist.ReduceOp.MAX, group=tp_group)
            sumexp = (logits - gmax[:, None]).exp().sum(-1)
            dist.all_reduce(sumexp, group=tp_group)

            target_logit = torch.zeros(span)
            in_shard = (y >= lo) & (y < hi)
            if in_shard.any():
                target_logit[in_shard] = logits[in_shard, y[in_shard] - lo]
                dist.all_reduce(target_logit, group=tp_group)
            else:
                # none of this chunk's targets fall in my vocab shard: contribute zeros
                dist.all_reduce(target_logit, group=mesh.get_group("cp"))

            nll = sumexp.log() + gmax - target_logit
            if tp_rank == 0:
                nll_sum += nll.sum()
                n_tokens += span

    totals = torch.cat([nll_sum, n_tokens])
    dist.all_reduce(totals)
    if dist.get_rank() == 0:
        print(f"bits per byte {totals[0].item() / totals[1].item() / 0.6931:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
