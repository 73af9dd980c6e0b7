"""4-stage pipeline x 2-way tensor parallel on a (pp=4, tp=2) mesh: stages 0-1 on host 0, stages 2-3 on
host 1. Within a host each tp rank talks to the same tp rank of the next stage; to halve cross-host
traffic, the host-crossing hop goes through tp rank 0 only, which re-broadcasts on its tp pair
(activations and gradients are replicated across a tp pair after the row-parallel all-reduce).

Held out (written blind, outside meshsim's tests, 2026-11-28; wrong blind (named 3: its tp partner, held in the
receive that precedes their broadcast, looked one call short). The bug: the host-crossing hop goes through tp rank 0
only, but the backward send lacks that rule: rank 5 sends its input gradient to rank 3, which never exchanges
anything with it. Culprit 5: a send whose peer went round its loop without ever talking to it.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

DEVICES_PER_HOST = 4
DIM, BS, STEPS = 32, 8, 5


class CopyToTP(torch.autograd.Function):  # Megatron's f: identity forward, all-reduce backward
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class ReduceFromTP(torch.autograd.Function):  # Megatron's g: all-reduce forward, identity backward
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class TPMLP(nn.Module):
    def __init__(self, group):
        super().__init__()
        self.group = group
        self.up = nn.Linear(DIM, DIM, bias=False)      # column shard
        self.down = nn.Linear(DIM, DIM, bias=False)    # row shard

    def forward(self, x):
        h = torch.relu(self.up(CopyToTP.apply(x, self.group)))
        return x + ReduceFromTP.apply(self.down(h), self.group)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("pp", "tp"))
    pp_group, tp_group = mesh.get_group("pp"), mesh.get_group("tp")
    stage, n_stages, tp_rank = mesh.get_local_rank("pp"), mesh.size(0), mesh.get_local_rank("tp")
    tp_root = dist.get_global_rank(tp_group, 0)
    host = rank // DEVICES_PER_HOST
    prev_peer = dist.get_global_rank(pp_group, stage - 1) if stage > 0 else None
    next_peer = dist.get_global_rank(pp_group, stage + 1) if stage < n_stages - 1 else None
    prev_remote = prev_peer is not None and prev_peer // DEVICES_PER_HOST != host
    next_remote = next_peer is not None and next_peer // DEVICES_PER_HOST != host

    def send_fwd(y):
        if next_peer is None or (next_remote and tp_rank != 0):
            return
        dist.send(y.contiguous(), next_peer)

    def recv_fwd():
        buf = torch.empty(BS, DIM)
        if prev_remote:
            if tp_rank == 0:
                dist.recv(buf, prev_peer)
            dist.broadcast(buf, src=tp_root, group=tp_group)
        else:
            dist.recv(buf, prev_peer)
        return buf

    def send_bwd(g):
        if prev_peer is None:
            return
        dist.send(g.contiguous(), prev_peer)

    def recv_bwd():
        buf = torch.empty(BS, DIM)
        if next_remote:
            if tp_rank == 0:
                dist.recv(buf, next_peer)
            dist.broadcast(buf, src=tp_root, group=tp_group)
        else:
            dist.recv(buf, next_peer)
        return buf

    torch.manual_seed(10 * stage + tp_rank)
    block = nn.Sequential(TPMLP(tp_group), TPMLP(tp_group))
    opt = torch.optim.SGD(block.parameters(), lr=0.01)
    for step in range(STEPS):
        if stage == 0:
            x = torch.randn(BS, DIM, generator=torch.Generator().manual_seed(step))
        else:
            x = recv_fwd().requires_grad_()
        y = block(x)
        if next_peer is None:
            loss = y.pow(2).mean()
            loss.backward()
            if tp_rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
        else:
            send_fwd(y.detach())
            y.backward(recv_bwd())
        if stage > 0:
            send_bwd(x.grad)
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
