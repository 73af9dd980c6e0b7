"""Encoder-decoder MLP split into an 8-stage pipeline, one stage per device: encoder stages 0-5 (host 0 and half
of host 1), decoder stages 6-7. Neighbouring stages share a 2-rank process group; activations go forward
with a broadcast from the sending stage, gradients come back with a broadcast from the receiving stage.
The last encoder stage applies the encoder's final norm and hands the memory to the decoder."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # frcase.py
import frcase  # noqa: E402
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DEVICES_PER_HOST = 4
HID = 40
MB = 8
STEPS = 5


def main():
    rank, world = dist.get_rank(), dist.get_world_size()
    stage, n_stages = rank, world
    n_enc = n_stages - 2
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


if __name__ == "__main__":
    frcase.run(main)
