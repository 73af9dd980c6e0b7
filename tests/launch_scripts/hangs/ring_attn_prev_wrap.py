"""Long-context language model with context parallelism: mesh (dp=2, cp=4), each host holds one replica,
and the sequence is split into 4 chunks over the cp ranks of the host. Short sequences gather K/V with an
all_gather; once the sequence-length curriculum passes RING_MIN_LEN, K/V travel around the cp ring with
batch_isend_irecv (ring attention). Gradients are averaged over the flattened dp x cp mesh.

Held out (written blind, outside meshsim's tests, 2026-11-28; wrong blind (named 0, 3 and 7: the ring's wrap-around
sends of 3 and 7 looked off the pattern). Each cp-rank-0 rank receives on a channel that crosses the cp groups every
other channel stays within, and on which nobody sends). The bug: Context parallelism on mesh (dp=2, cp=4); from step
2 the sequence curriculum reaches 64 tokens and attention switches from a cp all_gather to ring attention with
batch_isend_irecv (isend to next, irecv from prev) on the default group. next is computed through the cp group, but
prev as (rank - 1) % world, which is wrong only for the cp-rank-0 ranks: rank 0 posts its irecv from rank 7 (should
be 3) and rank 4 from rank 3 (should be 7). Ranks 3 and 7 send to 0 and 4 which never receive from them, and 7/3
never send to 0/4, so ranks 0 and 4 wait forever in the first ring round; the other ranks of each host wait in step
2's ring exchange for their predecessor (1 for 0, 2 for 1, 3 for 2 / its send to 0; likewise 5,6,7 on host 1), a
wait chain that closes on ranks 0 and 4."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

DEVICES_PER_HOST = 4
HID = 32
VOCAB = 64
RING_MIN_LEN = 64
SEQ_SCHEDULE = [32, 32, 64, 64, 128]  # sequence-length curriculum


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(HID, 3 * HID)
        self.proj = nn.Linear(HID, HID)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HID)
        self.attn = Attn()
        self.head = nn.Linear(HID, VOCAB)


def gathered_attention(q, k, v, cp_group, cp):
    ks = [torch.empty_like(k) for _ in range(cp)]
    vs = [torch.empty_like(v) for _ in range(cp)]
    dist.all_gather(ks, k.detach().contiguous(), group=cp_group)
    dist.all_gather(vs, v.detach().contiguous(), group=cp_group)
    return F.scaled_dot_product_attention(q, torch.cat(ks, 1), torch.cat(vs, 1))


def ring_attention(q, k, v, next_rank, prev_rank, cp):
    """Online-softmax accumulation while K/V blocks rotate around the ring."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = torch.full(q.shape[:-1] + (1,), -float("inf"))
    denom = torch.zeros_like(m)
    acc = torch.zeros_like(q)
    kv = torch.cat([k, v], -1).detach().contiguous()
    cur_k, cur_v = k, v
    for i in range(cp):
        if i < cp - 1:
            buf = torch.empty_like(kv)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, next_rank),
                                           dist.P2POp(dist.irecv, buf, prev_rank)])
        s = q @ cur_k.transpose(-1, -2) * scale
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        corr = torch.exp(m - m_new)
        denom = denom * corr + p.sum(-1, keepdim=True)
        acc = acc * corr + p @ cur_v
        m = m_new
        if i < cp - 1:
            for r in reqs:
                r.wait()
            kv = buf
            cur_k, cur_v = kv.split(HID, -1)
    return acc / denom


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // DEVICES_PER_HOST, DEVICES_PER_HOST), mesh_dim_names=("dp", "cp"))
    cp_group = mesh.get_group("cp")
    cp, cp_rank, dp_rank = mesh.size(1), mesh.get_local_rank("cp"), mesh.get_local_rank("dp")
    grad_group = mesh["dp", "cp"]._flatten("dp_cp").get_group()
    next_rank = dist.get_global_rank(cp_group, (cp_rank + 1) % cp)
    prev_rank = (rank - 1) % world

    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, seq_len in enumerate(SEQ_SCHEDULE):
        g = torch.Generator().manual_seed(step * 10 + dp_rank)
        tokens = torch.randint(0, VOCAB, (2, seq_len + 1), generator=g)
        chunk = seq_len // cp
        inp = tokens[:, cp_rank * chunk:(cp_rank + 1) * chunk]
        tgt = tokens[:, cp_rank * chunk + 1:(cp_rank + 1) * chunk + 1]
        h = model.emb(inp)
        q, k, v = model.attn.qkv(h).split(HID, -1)
        if seq_len >= RING_MIN_LEN:
            a = ring_attention(q, k, v, next_rank, prev_rank, cp)
        else:
            a = gathered_attention(q, k, v, cp_group, cp)
        logits = model.head(h + model.attn.proj(a))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1))
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, group=grad_group)
            p.grad /= world
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step} seq {seq_len} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
