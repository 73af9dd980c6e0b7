"""HSDP training of a small transformer-ish MLP stack with FSDP2 (fully_shard) on a (replicate=2,
shard=4) mesh: parameters are sharded within each host and replicated across the two hosts. Each rank
reads its own shard of token batches; after backward the token-weighted loss is logged over the job.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

DEVICES_PER_HOST = 4
VOCAB, DIM, SEQ, BATCH = 32, 16, 8, 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.ff = torch.nn.Sequential(torch.nn.Linear(DIM, 2 * DIM), torch.nn.GELU(), torch.nn.Linear(2 * DIM, DIM))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.emb(tokens)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def load(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    tokens = torch.randint(1, VOCAB, (BATCH, SEQ + 1), generator=g)
    keep = torch.ones(BATCH, dtype=torch.bool)
    if step == 2 and rank == 3:
        keep[:] = False  # every document of this batch was deduplicated away
    return tokens[keep]


def main():
    mesh = init_device_mesh("cpu", (2, DEVICES_PER_HOST), mesh_dim_names=("replicate", "shard"))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Model()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for step in range(5):
        tokens = load(step, rank)
        n_tok = tokens[:, 1:].numel()
        opt.zero_grad()
        if n_tok == 0:
            loss_sum = torch.zeros(())  # nothing to learn from this batch
        else:
            logits = model(tokens[:, :-1])
            loss_sum = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1), reduction="sum")
            (loss_sum / n_tok).backward()
        stats = torch.stack([loss_sum.detach(), torch.tensor(float(n_tok))])
        dist.all_reduce(stats)
        opt.step()
        if rank == 0:
            print(f"step {step} loss/token {stats[0].item() / max(stats[1].item(), 1):.4f}", flush=True)


if __name__ == "__main__":
    frcase.run(main)
