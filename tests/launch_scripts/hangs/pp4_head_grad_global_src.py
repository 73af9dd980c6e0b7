"""4-stage pipeline x 2 data-parallel replicas (one replica per host), blocking send/recv.

Mesh (2, 4) = ("dp", "pp"): host h runs stages 0..3 on ranks 4h..4h+3. Stage 3 holds the LM-style head and
the loss; it sends the grad of its input back to stage 2 through a dedicated helper.

Held out (written blind, outside meshsim's tests, 2026-11-28; wrong when measured: named 3 and 7, the heads, whose
backward send is at a line of their own). The bug: stage 2 receives the head's gradient through a helper that calls
dist.recv(src=3) on the default group instead of group_src=3 on the pp group. Its author's key says rank 6 alone
(on host 0, src 3 is the right rank), but a send pairs with a receive on its own group only: the stacks show ranks
2 and 6 both in that recv and the heads 3 and 7 both in their send on the pp group. Culprits: 2 and 6 (a receive on
another process group than their other sends and receives).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

DEVICES_PER_HOST = 4
NUM_STAGES = 4
STEPS = 5
MICRO = 4
DIM = 16


def recv_grad_from_head(buf):
    # the head stage is the last pipeline stage
    dist.recv(buf, src=NUM_STAGES - 1)
    return buf


def main():
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "pp"))
    rank = dist.get_rank()
    pp_pg, dp_pg = mesh.get_group("pp"), mesh.get_group("dp")
    stage = mesh["pp"].get_local_rank()
    is_first, is_last = stage == 0, stage == NUM_STAGES - 1

    torch.manual_seed(stage)
    block = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh())
    head = nn.Linear(DIM, 1) if is_last else None
    params = list(block.parameters()) + (list(head.parameters()) if head else [])
    opt = torch.optim.SGD(params, lr=1e-2)
    gen = torch.Generator().manual_seed(mesh["dp"].get_local_rank())

    for step in range(STEPS):
        opt.zero_grad()
        x = torch.randn(MICRO, DIM, generator=gen)
        target = x.mean(1, keepdim=True)
        # forward
        if is_first:
            inp = x
        else:
            inp = torch.empty(MICRO, DIM)
            dist.recv(inp, group=pp_pg, group_src=stage - 1)
            inp.requires_grad_(True)
        act = block(inp)
        if is_last:
            loss = nn.functional.mse_loss(head(act), target)
            loss.backward()
        else:
            dist.send(act.detach(), group=pp_pg, group_dst=stage + 1)
            grad = torch.empty(MICRO, DIM)
            if stage == NUM_STAGES - 2:
                recv_grad_from_head(grad)
            else:
                dist.recv(grad, group=pp_pg, group_src=stage + 1)
            act.backward(grad)
            loss = torch.zeros(())
        # backward to the previous stage
        if not is_first:
            dist.send(inp.grad, group=pp_pg, group_dst=stage - 1)
        # data parallel: average this stage's grads with the same stage on the other host
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=dp_pg)
        off = 0
        for p in params:
            p.grad.copy_(flat[off:off + p.numel()].view_as(p) / 2)
            off += p.numel()
        opt.step()
        if is_last:
            print(f"[rank {rank}] step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
