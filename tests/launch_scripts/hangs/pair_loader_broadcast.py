"""2-way tensor-parallel classifier on a (4, 2) mesh. Only the first rank of each tp pair reads the data; it
broadcasts the batch length on a small metadata group and then the padded token ids on the tp group.

Held out (written blind, outside meshsim's tests, 2026-11-27):
pair_loader_broadcast [6] (class 3, order swap in 2-member groups; mesh (4,2) + a metadata pair group per tp pair).
Only the last replica's reader (rank 6) reaches the ragged-last-batch branch, which broadcasts the batch on the tp
pair before the length on the metadata pair; its partner 7 keeps the normal order, the other pairs are fine.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

N_SAMPLES, SEQ, BATCH, VOCAB, DIM, CLASSES = 46, 12, 4, 100, 32, 5


def load_shard(dp_rank, dp_size):
    g = torch.Generator().manual_seed(2024)
    tokens = torch.randint(1, VOCAB, (N_SAMPLES, SEQ), generator=g)
    labels = tokens.sum(1) % CLASSES
    per_replica = -(-N_SAMPLES // dp_size)
    lo = dp_rank * per_replica
    return tokens[lo:lo + per_replica], labels[lo:lo + per_replica]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
    dp_rank, tp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    tp_group, dp_group = mesh.get_group("tp"), mesh.get_group("dp")
    pairs = [mesh.mesh[i].tolist() for i in range(mesh.size(0))]
    meta_group, _ = dist.new_subgroups_by_enumeration(pairs, backend="gloo")
    reader = dist.get_global_rank(tp_group, 0)

    torch.manual_seed(0)
    emb = torch.randn(VOCAB, DIM).chunk(2, dim=1)[tp_rank].clone().requires_grad_()
    head = torch.randn(DIM, CLASSES).chunk(2, dim=0)[tp_rank].clone().requires_grad_()
    opt = torch.optim.SGD([emb, head], lr=0.1)
    tokens, labels = load_shard(dp_rank, mesh.size(0)) if rank == reader else (None, None)
    per_replica = -(-N_SAMPLES // mesh.size(0))
    n_batches = -(-per_replica // BATCH)

    for b in range(n_batches):
        n = torch.zeros(1, dtype=torch.long)
        batch = torch.zeros(BATCH, SEQ + 1, dtype=torch.long)
        if rank == reader:
            x, y = tokens[b * BATCH:(b + 1) * BATCH], labels[b * BATCH:(b + 1) * BATCH]
            n.fill_(len(x))
            batch[:len(x), :SEQ], batch[:len(x), SEQ] = x, y
            if len(x) == BATCH:
                dist.broadcast(n, src=reader, group=meta_group)
                dist.broadcast(batch, src=reader, group=tp_group)
            else:  # ragged last batch: rows past n are padding
                dist.broadcast(batch, src=reader, group=tp_group)
                dist.broadcast(n, src=reader, group=meta_group)
        else:
            dist.broadcast(n, src=reader, group=meta_group)
            dist.broadcast(batch, src=reader, group=tp_group)
        x, y = batch[:n.item(), :SEQ], batch[:n.item(), SEQ]

        feats = emb[x].mean(1)                       # [n, DIM/2]
        partial = feats @ head
        logits = partial.detach().clone()
        dist.all_reduce(logits, group=tp_group)
        logits = partial + (logits - partial).detach()
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        for p in (emb, head):
            dist.all_reduce(p.grad, group=dp_group)
        opt.step()
        if rank == 0:
            print(f"batch {b} n={n.item()} loss {loss.item():.3f}", flush=True)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
