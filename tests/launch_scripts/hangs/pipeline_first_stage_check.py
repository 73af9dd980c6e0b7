"""2 x 4 (dp, pp) job: a 4-stage pipeline replicated twice, forward-only microbatches passed with
send/recv between neighbouring stages, then data-parallel gradient averaging per stage.

Held out (written blind, outside meshsim's tests, 2026-11-27; missed blind: every stage of the second pipeline waits
at its first call, so under each shift of the mesh the healthy first stage, rank 0, differed from its images and was
named): pipeline_first_stage_check [4]. The first-stage test uses the global rank (rank == 0) instead of the stage
index, so rank 4 (stage 0 of the second pipeline) recvs from the last stage, 7, which never sends to it; 5, 6 and
7 wait down the chain, and 0-3 wait in the dp all_reduce.
"""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

MICROBATCHES = 3
HIDDEN = 16


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "pp"))
    rank = dist.get_rank()
    stage, num_stages = mesh.get_local_rank("pp"), mesh.size(1)
    pp_ranks = mesh["pp"].mesh.tolist()  # global ranks of my pipeline, stage order
    prev_rank, next_rank = pp_ranks[stage - 1], pp_ranks[(stage + 1) % num_stages]

    is_first = rank == 0
    is_last = stage == num_stages - 1

    torch.manual_seed(stage)
    layer = nn.Linear(HIDDEN, HIDDEN)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)

    for step in range(2):
        losses = []
        for _mb in range(MICROBATCHES):
            if is_first:
                x = torch.randn(4, HIDDEN)  # the first stage owns the data loader
            else:
                x = torch.empty(4, HIDDEN)
                dist.recv(x, src=prev_rank)
            y = torch.tanh(layer(x))
            if is_last:
                losses.append(y.pow(2).mean())
            else:
                dist.send(y.detach(), dst=next_rank)
                losses.append(y.pow(2).mean())
        torch.stack(losses).sum().backward()
        for p in layer.parameters():
            dist.all_reduce(p.grad, group=mesh.get_group("dp"))
            p.grad /= mesh.size(0)
        opt.step()
        opt.zero_grad()
        if is_last:
            print(f"[dp {mesh.get_local_rank('dp')}] step {step} loss {sum(x.item() for x in losses):.4f}", flush=True)
        time.sleep(0.05 * stage)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
