"""Self-distillation with an EMA teacher, 8-way data parallel (2 hosts x 4 devices).

A packing loader fills every rank's batch up to a token budget, so the number of samples per rank varies
(short documents pack more). Each host keeps one teacher copy in sync across its devices: every
SYNC_EVERY samples seen by the job, the host's devices average their teacher weights.

Held back (written blind, outside meshsim's tests, 2026-11-28; right culprit when measured, read as two calls in
opposite orders). The bug: the sample clock adds local_batch * world instead of the all-reduced global count, so
rank 6, which packs 12 short documents at step 1, crosses the threshold a step early and makes one host-group
all_reduce (teacher sync) that ranks 4, 5 and 7 do not make yet. Rank 6 waits there; every other rank goes on to
step 2's world all_reduce of gradients, which rank 6 never joins. Culprit: 6 (one call more on its host group, at a
line no other rank reached).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DEVICES_PER_HOST = 4
DIM, CLASSES, STEPS, TOKEN_BUDGET = 24, 10, 5, 64
SYNC_EVERY = 96


def packed_batch(rank, step):
    """Documents of 16 tokens pack 4 to a batch; rank 6's shard has a run of 5-token snippets at step 1."""
    g = torch.Generator().manual_seed(100 * rank + step)
    doc_len = 5 if (rank == 6 and step == 1) else 16
    n = TOKEN_BUDGET // doc_len
    x = torch.randn(n, DIM, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return x, y


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 48), nn.ReLU(), nn.Linear(48, CLASSES))

    def forward(self, x):
        return self.net(x)


def main():
    rank, world = dist.get_rank(), dist.get_world_size()
    host = rank // DEVICES_PER_HOST
    host_groups = [[h * DEVICES_PER_HOST + d for d in range(DEVICES_PER_HOST)]
                   for h in range(world // DEVICES_PER_HOST)]
    host_group, _ = dist.new_subgroups_by_enumeration(host_groups)

    torch.manual_seed(0)
    student = Student()
    teacher = Student()
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    seen = 0

    for step in range(STEPS):
        x, y = packed_batch(rank, step)
        logits = student(x)
        with torch.no_grad():
            t_logits = teacher(x)
        loss = F.cross_entropy(logits, y) + 0.5 * F.kl_div(
            F.log_softmax(logits, -1), F.softmax(t_logits, -1), reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.flatten() for p in student.parameters()])
        dist.all_reduce(flat)
        flat /= world
        off = 0
        for p in student.parameters():
            p.grad.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        opt.step()
        stats = torch.tensor([loss.item() * len(y), float(len(y))])
        dist.all_reduce(stats)
        seen += int(len(y)) * world

        with torch.no_grad():
            for pt, ps in zip(teacher.parameters(), student.parameters()):
                pt.mul_(0.99).add_(ps, alpha=0.01)
        if seen >= SYNC_EVERY:
            seen -= SYNC_EVERY
            tflat = torch.cat([p.flatten() for p in teacher.parameters()])
            dist.all_reduce(tflat, group=host_group)
            tflat /= DEVICES_PER_HOST
            off = 0
            for p in teacher.parameters():
                p.copy_(tflat[off:off + p.numel()].view_as(p))
                off += p.numel()
        if rank == 0:
            print(f"step {step} host {host} loss {stats[0] / stats[1]:.4f} samples {int(stats[1])}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    dist.init_process_group("gloo")
    main()
