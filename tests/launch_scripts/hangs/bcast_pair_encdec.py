"""Encoder-decoder MLP split into an 8-stage pipeline, one stage per device: encoder stages 0-3 on host 0,
decoder stages 4-7 on host 1. Neighbouring stages share a 2-rank process group; activations go forward
with a broadcast from the sending stage, gradients come back with a broadcast from the receiving stage.
The last encoder stage applies the encoder's final norm and hands the memory to the decoder.

Held out (written blind, outside meshsim's tests, 2026-11-28; wrong blind (named 1 and 2, as two calls in opposite
orders). Rank 3's first call on its downstream link receives (root +1) where every other stage's first call on that
link sends (root itself)). The bug: 8-stage encoder-decoder pipeline, one stage per rank, activations and gradients
passed by broadcast on 2-rank link groups link[i] = {i, i+1} (dist.new_group). The last encoder stage (rank 3) sends
its normed memory on link[stage - 1] = {2,3} (copy-paste from the receive line) instead of link[3] = {3,4}. At step
0 rank 2, which after its forward waits for its gradient on {2,3} with src 3, takes rank 3's memory as the gradient
(same shape: completed by mistake) and finishes its backward, as do ranks 1 and 0. Rank 3 then waits for its
gradient on {3,4} with src 4 while rank 4 waits for its input on {3,4} with src 3: a cycle between 3 and 4. Ranks
5-7 wait for activations down the chain ({4,5}, {5,6}, {6,7}); ranks 0-2 go on to step 1 and block: rank 2
broadcasting its activation on {2,3}, rank 1 waiting for rank 2's gradient on {1,2}, rank 0 for rank 1's gradient on
{0,1}."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DEVICES_PER_HOST = 4
HID = 40
MB = 8
STEPS = 5


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stage, n_stages = rank, world
    n_enc = n_stages // 2
    # link[i] joins stage i and stage i+1
    link = [dist.new_group([i, i + 1]) for i in range(n_stages - 1)]
    first, last = stage == 0, stage == n_stages - 1
    last_encoder = stage == n_enc - 1

    torch.manual_seed(stage)
    block = nn.Sequential(nn.Linear(HID, HID), nn.GELU(), nn.Linear(HID, HID))
    enc_norm = nn.LayerNorm(HID) if last_encoder else None
    head = nn.Linear(HID, 4) if last else None
    params = [p for m in (block, enc_norm, head) if m is not None for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)

    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        src = torch.randn(MB, HID, generator=g)
        labels = torch.randint(0, 4, (MB,), generator=g)
        # ---- forward
        if first:
            x = src.clone().requires_grad_()
        else:
            x = torch.empty(MB, HID)
            dist.broadcast(x, src=stage - 1, group=link[stage - 1])
            x.requires_grad_()
        y = x + block(x)
        if last_encoder:
            memory = enc_norm(y)
            out = memory.detach().contiguous()
            dist.broadcast(out, src=stage, group=link[stage - 1])
            y = memory
        elif last:
            loss = F.cross_entropy(head(y), labels)
        else:
            dist.broadcast(y.detach().contiguous(), src=stage, group=link[stage])
        # ---- backward
        if last:
            loss.backward()
        else:
            gy = torch.empty(MB, HID)
            dist.broadcast(gy, src=stage + 1, group=link[stage])
            y.backward(gy)
        if not first:
            dist.broadcast(x.grad.contiguous(), src=stage, group=link[stage - 1])
        opt.step()
        opt.zero_grad()
        if last:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
