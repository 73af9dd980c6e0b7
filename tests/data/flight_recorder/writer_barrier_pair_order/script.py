"""Tensor-parallel pairs (new_subgroups_by_enumeration) of a row-parallel MLP, 4 replicas; the loss is
averaged over the job. Every CKPT_EVERY steps each rank saves its shard and the host's shards are
fenced by a barrier on the host group (dist.new_group); one rank per job (WRITER_RANK) then writes the
manifest that lists the host's shards. Checkpoint work is done in step hooks.
"""
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frcase  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DEVICES_PER_HOST = 4
DIM, HIDDEN, BATCH = 16, 32, 8
CKPT_EVERY, WRITER_RANK = 2, 2


def main():
    rank, world = dist.get_rank(), dist.get_world_size()
    host = rank // DEVICES_PER_HOST
    host_groups = [dist.new_group(list(range(h * DEVICES_PER_HOST, (h + 1) * DEVICES_PER_HOST)))
                   for h in range(world // DEVICES_PER_HOST)]
    host_group = host_groups[host]
    tp_group, _ = dist.new_subgroups_by_enumeration([[r, r + 1] for r in range(0, world, 2)])
    tp_rank = dist.get_rank(tp_group)

    torch.manual_seed(0)
    w1 = torch.randn(DIM, HIDDEN)[:, tp_rank::2].contiguous().mul_(0.1).requires_grad_()
    w2 = torch.randn(HIDDEN, DIM)[tp_rank::2].contiguous().mul_(0.1).requires_grad_()
    opt = torch.optim.SGD([w1, w2], lr=0.05)
    shards = {}

    def save_shard(step):
        buf = io.BytesIO()
        torch.save({"w1": w1.detach(), "w2": w2.detach(), "step": step}, buf)
        shards[step] = buf.getvalue()

    def on_step_begin(step):
        if rank == WRITER_RANK and step > 0 and step % CKPT_EVERY == 0:
            dist.barrier(group=host_group)  # every shard of the host is on disk
            print(f"manifest for step {step}: {DEVICES_PER_HOST} shards of host {host}", flush=True)

    def on_step_end(step):
        if step > 0 and step % CKPT_EVERY == 0:
            save_shard(step)
            if rank != WRITER_RANK:
                dist.barrier(group=host_group)

    for step in range(5):
        on_step_begin(step)
        g = torch.Generator().manual_seed(step * 10 + rank // 2)
        x = torch.randn(BATCH, DIM, generator=g)
        partial = torch.relu(x @ w1) @ w2
        full = partial.detach().clone()
        dist.all_reduce(full, group=tp_group)
        out = partial + (full - partial).detach()
        loss = (out - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        log = loss.detach().reshape(1).clone()
        dist.all_reduce(log)
        if rank == 0:
            print(f"step {step} loss {log.item() / world:.4f}", flush=True)
        on_step_end(step)


if __name__ == "__main__":
    frcase.run(main)
