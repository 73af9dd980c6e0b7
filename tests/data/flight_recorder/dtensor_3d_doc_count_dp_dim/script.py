"""Token-level language model on a 3-D mesh (dp=2, cp=2, tp=2): the MLP is tensor-parallel through DTensor
(ColwiseParallel/RowwiseParallel on mesh["tp"]), each sample's sequence is split over the cp ranks, and
gradients are averaged over the flattened dp x cp mesh. The loss is normalised by the number of supervised
tokens of the whole sequence; for packed samples (several documents in one sequence) it is normalised per
document. Token counts are summed over the sequence chunks with a Partial DTensor."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # frcase.py
import frcase  # noqa: E402
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

DEVICES_PER_HOST = 4
HID = 32
VOCAB = 50
SEQ = 32
MAX_DOCS = 4
STEPS = 5


class TokenLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HID)
        self.fc1 = nn.Linear(HID, 4 * HID)
        self.fc2 = nn.Linear(4 * HID, HID)
        self.head = nn.Linear(HID, VOCAB)

    def forward(self, tok):
        h = self.emb(tok)
        h = h + self.fc2(F.gelu(self.fc1(h)))
        return self.head(h)


def sample(step, dp_rank):
    """One sequence per replica per step, with document ids and a mask of supervised tokens."""
    g = torch.Generator().manual_seed(step * 7 + dp_rank)
    tokens = torch.randint(0, VOCAB, (SEQ + 1,), generator=g)
    doc_ids = torch.zeros(SEQ, dtype=torch.long)
    if (step, dp_rank) == (2, 0):  # the packer put two documents into this sequence
        doc_ids[SEQ // 2 - 5:] = 1
    mask = torch.ones(SEQ, dtype=torch.bool)
    mask[:4] = False  # prompt tokens carry no loss
    return tokens, doc_ids, mask


def main():
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    dp_rank, cp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("cp")
    cp = mesh.size(1)
    grad_group = mesh["dp", "cp"]._flatten("dp_cp").get_group()

    torch.manual_seed(0)
    model = TokenLM()
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    for step in range(STEPS):
        tokens, doc_ids, mask = sample(step, dp_rank)
        chunk = SEQ // cp
        sl = slice(cp_rank * chunk, (cp_rank + 1) * chunk)
        inp, tgt = tokens[:-1][sl], tokens[1:][sl]
        d, m = doc_ids[sl], mask[sl]
        tok_loss = F.cross_entropy(model(inp[None])[0], tgt, reduction="none") * m
        if int(doc_ids.max()) > 0:  # packed sample: every document weighs the same
            counts = torch.zeros(MAX_DOCS).index_add_(0, d, m.float())
            counts = DTensor.from_local(counts, mesh["dp"], [Partial()]).full_tensor()
            n_docs = int(doc_ids.max()) + 1
            loss = (tok_loss / counts[d].clamp(min=1)).sum() / n_docs
        else:
            n_tok = DTensor.from_local(m.sum().float(), mesh["cp"], [Partial()]).full_tensor()
            loss = tok_loss.sum() / n_tok
        loss.backward()
        for p in model.parameters():
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(g, group=grad_group)
            g /= grad_group.size()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    frcase.run(main)
