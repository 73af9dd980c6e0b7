"""4-stage pipeline (per host) on the 'pp' dim of a (dp=2, pp=4) mesh, batch_isend_irecv p2p.
Stage 1 holds a frozen encoder block (transfer learning: only stages 0, 2, 3 are trained).

Held out (written blind, outside meshsim's tests, 2026-11-28; wrong blind (named 0 and 4: every send and receive is
made through one helper, so each looked like any other at its line). The bug: stage 1 (ranks 1 and 5) is frozen and
its code skips the whole backward, so it never passes the gradient back and receives the next step's input where
every other stage receives a gradient. Culprits 1 and 5: the line each call came from (the helper's caller) tells
the calls apart, and after their last forward send twice as many ranks went on to the gradient's receive.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

DEVICES_PER_HOST = 4
HIDDEN, MICRO_BS, N_MICRO, STEPS = 32, 4, 2, 4
FROZEN_STAGES = {1}


def p2p(op, tensor, peer):
    reqs = dist.batch_isend_irecv([dist.P2POp(op, tensor, peer)])
    for r in reqs:
        r.wait()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size() // DEVICES_PER_HOST, DEVICES_PER_HOST),
                            mesh_dim_names=("dp", "pp"))
    pp_group, dp_group = mesh.get_group("pp"), mesh.get_group("dp")
    stage, n_stages = mesh.get_local_rank("pp"), mesh.size(1)
    prev_rank = dist.get_global_rank(pp_group, stage - 1) if stage > 0 else None
    next_rank = dist.get_global_rank(pp_group, stage + 1) if stage < n_stages - 1 else None
    torch.manual_seed(100 + stage)
    block = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN))
    trainable = stage not in FROZEN_STAGES
    for p in block.parameters():
        p.requires_grad_(trainable)
    opt = torch.optim.SGD(block.parameters(), lr=0.01) if trainable else None
    gen = torch.Generator().manual_seed(1234 + mesh.get_local_rank("dp"))

    for step in range(STEPS):
        inputs, outputs, losses = [], [], []
        for _mb in range(N_MICRO):
            if stage == 0:
                x = torch.randn(MICRO_BS, HIDDEN, generator=gen)
            else:
                x = torch.empty(MICRO_BS, HIDDEN)
                p2p(dist.irecv, x, prev_rank)
            x.requires_grad_(stage > 0)
            y = block(x)
            if next_rank is not None:
                p2p(dist.isend, y.detach().contiguous(), next_rank)
            else:
                losses.append(y.pow(2).mean())
            inputs.append(x)
            outputs.append(y)
        # backward, microbatches in reverse
        if trainable:  # frozen stages have no parameters to update
            for mb in reversed(range(N_MICRO)):
                if next_rank is None:
                    losses[mb].backward()
                else:
                    g = torch.empty(MICRO_BS, HIDDEN)
                    p2p(dist.irecv, g, next_rank)
                    outputs[mb].backward(g)
                if prev_rank is not None:
                    p2p(dist.isend, inputs[mb].grad.contiguous(), prev_rank)
        if trainable:
            for p in block.parameters():
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= mesh.size(0)
            opt.step()
            opt.zero_grad()
        if next_rank is None and rank == dist.get_global_rank(pp_group, n_stages - 1):
            print(f"rank {rank} step {step} loss {sum(loss.item() for loss in losses) / N_MICRO:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
