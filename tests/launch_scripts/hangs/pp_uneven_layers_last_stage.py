"""8-stage pipeline (2 hosts x 4 devices) of a 26-layer MLP trained with batch_isend_irecv.

Layers are split evenly over the stages; the last stage takes the remainder and owns the loss.

Held back (written blind, outside meshsim's tests, 2026-11-28; wrong when measured (named 0: under a shift of the
ranks the pipeline looks like a ring, in which the first stage alone skips its receive)). The bug: the last-stage
test compares the even share, not the remainder, so rank 7 thinks it is a middle stage and sends its output to
(stage + 1) % 8 = rank 0, then waits for a gradient from it; every other stage waits for the gradient from the next.
Culprit 7: every other stage calls its next one, the rank +1 from it; a first stage that never made a call at the
receive line is a part of the program apart, which a shift of the ranks cannot tell from a skip.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

N_LAYERS = 26
HID = 32
MICRO = 4
STEPS = 5


def layer_range(stage, n_stages):
    per = N_LAYERS // n_stages
    start = stage * per
    end = start + per if stage < n_stages - 1 else N_LAYERS  # the last stage takes the remainder
    return start, end


def make_batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(MICRO, HID, generator=g)
    y = torch.tanh(x.flip(1))
    return x, y


def p2p(ops):
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def main():
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("pp",))
    pp_group = mesh.get_group("pp")
    pp_ranks = dist.get_process_group_ranks(pp_group)
    stage = mesh.get_local_rank("pp")
    n_stages = len(pp_ranks)
    host = dist.get_rank() // 4

    start, end = layer_range(stage, n_stages)
    torch.manual_seed(stage)
    block = nn.Sequential(*[nn.Sequential(nn.Linear(HID, HID), nn.GELU()) for _ in range(end - start)])
    opt = torch.optim.SGD(block.parameters(), lr=0.01)

    is_first = stage == 0
    is_last = start + N_LAYERS // n_stages == N_LAYERS
    prev_rank = pp_ranks[stage - 1]
    next_rank = pp_ranks[(stage + 1) % n_stages]

    for step in range(STEPS):
        x, y = make_batch(step)
        if is_first:
            inp = x
        else:
            inp = torch.empty(MICRO, HID)
            p2p([dist.P2POp(dist.irecv, inp, prev_rank, pp_group)])
            inp.requires_grad_(True)
        out = block(inp)
        if is_last:
            loss = F.mse_loss(out, y)
            loss.backward()
            print(f"step {step} host {host} stage {stage} loss {loss.item():.4f}", flush=True)
        else:
            grad = torch.empty_like(out)
            # send activations forward and wait for the gradient coming back from the next stage
            p2p([dist.P2POp(dist.isend, out.detach().contiguous(), next_rank, pp_group),
                 dist.P2POp(dist.irecv, grad, next_rank, pp_group)])
            out.backward(grad)
        if not is_first:
            p2p([dist.P2POp(dist.isend, inp.grad.contiguous(), prev_rank, pp_group)])
        opt.step()
        opt.zero_grad()

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
