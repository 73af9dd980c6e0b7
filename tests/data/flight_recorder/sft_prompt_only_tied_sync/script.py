"""SFT on two 4-stage pipelines (one per host) whose stages talk through broadcasts on 2-rank groups, gloo/CPU.

Mesh (dp=2, pp=4). Stage s hands its activation to stage s+1 with a broadcast on the pair group {s, s+1}
(src = s) and gets the activation gradient back on the same group (src = s+1). The input embedding (stage 0)
and the output projection (last stage) are tied: after the backward pass the two stages swap their gradients
on the pair group {first, last} (stage 0's first, then the last stage's). Finally the dp replicas average.
Only the last stage sees the labels; prompt tokens are masked with -100.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

DEVICES_PER_HOST = 4
VOCAB, HIDDEN, SEQ, BATCH, STEPS = 64, 32, 12, 4, 5
IGNORE = -100


def load_batch(step, dp_rank):
    g = torch.Generator().manual_seed(2003 * step + dp_rank)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    labels = tokens[:, 1:].clone()
    prompt_len = torch.randint(2, SEQ // 2, (BATCH,), generator=g)
    if step == 2 and dp_rank == 1:
        prompt_len[:] = SEQ  # a batch of prompts whose answers were truncated away
    for i, n in enumerate(prompt_len.tolist()):
        labels[i, :n] = IGNORE
    return tokens[:, :-1], labels


def main():
    rank = dist.get_rank()
    host = rank // DEVICES_PER_HOST
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "pp"))
    stage, n_stages = mesh.get_local_rank("pp"), mesh["pp"].size()
    dp_group, dp_rank = mesh["dp"].get_group(), mesh.get_local_rank("dp")
    pipes = mesh.mesh.tolist()
    # every rank creates every group, in the same order
    pair = {}
    tied = {}
    for p, ranks in enumerate(pipes):
        for s in range(n_stages - 1):
            pair[(p, s)] = dist.new_group([ranks[s], ranks[s + 1]])
        tied[p] = dist.new_group([ranks[0], ranks[-1]])
    me = pipes[dp_rank]
    first, last = stage == 0, stage == n_stages - 1

    torch.manual_seed(stage)
    layer = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
    params = list(layer.parameters())
    torch.manual_seed(0)
    shared = nn.Embedding(VOCAB, HIDDEN).weight.detach()
    if first:
        embed = nn.Embedding(VOCAB, HIDDEN)
        with torch.no_grad():
            embed.weight.copy_(shared)
        params.append(embed.weight)
    if last:
        out_proj = nn.Linear(HIDDEN, VOCAB, bias=False)
        with torch.no_grad():
            out_proj.weight.copy_(shared)
        params.append(out_proj.weight)
    opt = torch.optim.SGD(params, lr=0.05)

    def tied_sync():
        mine = (embed.weight if first else out_proj.weight).grad
        from_first = mine.clone() if first else torch.empty_like(mine)
        dist.broadcast(from_first, src=me[0], group=tied[dp_rank])
        from_last = mine.clone() if last else torch.empty_like(mine)
        dist.broadcast(from_last, src=me[-1], group=tied[dp_rank])
        mine.copy_(from_first + from_last)

    for step in range(STEPS):
        tokens, labels = load_batch(step, dp_rank)
        opt.zero_grad()
        tied_done = False
        if first:
            x = embed(tokens)
        else:
            x = torch.empty(BATCH, SEQ, HIDDEN)
            dist.broadcast(x, src=me[stage - 1], group=pair[(dp_rank, stage - 1)])
            x.requires_grad_()
        out = layer(x)
        if not last:
            dist.broadcast(out.detach().contiguous(), src=me[stage], group=pair[(dp_rank, stage)])
            grad = torch.empty_like(out)
            dist.broadcast(grad, src=me[stage + 1], group=pair[(dp_rank, stage)])
            out.backward(grad)
        elif (labels != IGNORE).any():
            loss = nn.functional.cross_entropy(out_proj(out).reshape(-1, VOCAB), labels.reshape(-1),
                                               ignore_index=IGNORE)
            loss.backward()
        else:
            # nothing to learn from this batch: no loss, zero gradients everywhere
            loss = torch.zeros(())
            out_proj.weight.grad = torch.zeros_like(out_proj.weight)
            tied_sync()  # the tied gradient is ready already: sync it now
            tied_done = True
            x.grad = torch.zeros_like(x)
        if not first:
            dist.broadcast(x.grad.contiguous(), src=me[stage], group=pair[(dp_rank, stage - 1)])
        if (first or last) and not tied_done:
            tied_sync()

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= 2
        opt.step()
        if last:
            print(f"[pipe {dp_rank}] step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    frcase.run(main)
