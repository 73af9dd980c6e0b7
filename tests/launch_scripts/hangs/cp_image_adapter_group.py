"""Multimodal LM block on a 3-D mesh (dp=2, cp=2, tp=2): each host is one data-parallel replica; the
sequence is split in two context-parallel chunks, and the MLP and the image adapter are tensor parallel.

Per step: the cp ranks all-gather K/V of both chunks, the MLP's row-parallel output is summed over tp, and
chunks that contain image patch tokens also run the (tensor-parallel) image adapter.

Held back (written blind, outside meshsim's tests, 2026-11-28; right culprits when measured, read as skips of the
dp all_reduce). The bug: the image adapter's row-parallel all_reduce uses the cp group instead of tp. At step 2
only replica 1's second chunk (ranks 6 and 7) has image tokens: each calls the adapter all_reduce on its cp pair,
which its cp partner's next all_gather meets and never completes; host 0 waits in the dp all_reduce. Culprits: 6
and 7 (an all_reduce on cp where their peers call all_reduce on tp at that point).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

DEVICES_PER_HOST = 4
VOCAB, DIM, SEQ, STEPS = 40, 16, 16, 5
IMG = VOCAB - 1  # placeholder id of an image patch token


def sample(dp_rank, step):
    g = torch.Generator().manual_seed(31 * dp_rank + step)
    toks = torch.randint(0, VOCAB - 1, (SEQ + 1,), generator=g)
    if dp_rank == 1 and step == 2:
        toks[11:15] = IMG  # an interleaved image-text document
    return toks[:-1], toks[1:]


def main():
    rank = dist.get_rank()
    host = rank // DEVICES_PER_HOST
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    dp, cp, tp = mesh.get_group("dp"), mesh.get_group("cp"), mesh.get_group("tp")
    dp_rank, cp_rank, tp_rank = (mesh.get_local_rank(d) for d in ("dp", "cp", "tp"))
    chunk = SEQ // 2
    torch.manual_seed(0)
    embed = nn.Embedding(VOCAB, DIM)
    qkv = nn.Linear(DIM, 3 * DIM)
    w_up = nn.Linear(DIM, 2 * DIM)      # column shard of a 4*DIM MLP
    w_down = nn.Linear(2 * DIM, DIM, bias=False)  # row shard
    adapter = nn.Linear(DIM, DIM // 2)  # column shard of the image adapter
    adapter_out = nn.Linear(DIM // 2, DIM, bias=False)
    head = nn.Linear(DIM, VOCAB)
    mods = [embed, qkv, w_up, w_down, adapter, adapter_out, head]
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)

    for step in range(STEPS):
        inputs, targets = sample(dp_rank, step)
        sl = slice(cp_rank * chunk, (cp_rank + 1) * chunk)
        x = embed(inputs[sl])
        q, k, v = qkv(x).chunk(3, -1)
        kv = torch.cat([k, v], -1).detach().contiguous()
        kv_all = torch.empty(2 * chunk, 2 * DIM)
        dist.all_gather_into_tensor(kv_all, kv, group=cp)
        kv_all[sl] = torch.cat([k, v], -1)  # keep the local chunk in the graph
        k_all, v_all = kv_all.chunk(2, -1)
        causal = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk).unsqueeze(1) >= torch.arange(SEQ)
        x = x + F.scaled_dot_product_attention(q.unsqueeze(0), k_all.unsqueeze(0), v_all.unsqueeze(0),
                                               attn_mask=causal).squeeze(0)
        is_img = inputs[sl] == IMG
        if is_img.any():
            part = adapter_out(F.gelu(adapter(x)))
            summed = part.detach().clone()
            dist.all_reduce(summed, group=cp)
            x = x + torch.where(is_img.unsqueeze(-1), part + (summed - part.detach()), torch.zeros_like(part))
        part = w_down(F.gelu(w_up(x)))
        summed = part.detach().clone()
        dist.all_reduce(summed, group=tp)
        x = x + part + (summed - part.detach())
        loss = F.cross_entropy(head(x), targets[sl])
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in params])
        dist.all_reduce(flat, group=dp)
        off = 0
        for p in params:
            p.grad = (flat[off:off + p.numel()] / 2).view_as(p).clone()
            off += p.numel()
        opt.step()
        if rank == 0:
            print(f"step {step} host {host} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    dist.init_process_group("gloo")
    main()
