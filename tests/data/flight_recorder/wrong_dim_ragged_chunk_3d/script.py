"""Row-parallel LM head with context parallelism on a (dp=2, cp=2, tp=2) mesh: each cp rank scores one half of
the sequence, each tp rank holds half of the hidden dim. Token-level loss stats are summed over cp."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

VOCAB, DIM = 50, 32
SEQ_LENS = {0: [32, 32, 32], 1: [32, 32, 29]}  # per replica, one batch of 2 sequences each


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    dp_rank, cp_rank, tp_rank = (mesh.get_local_rank(d) for d in ("dp", "cp", "tp"))
    tp_group, cp_group = mesh.get_group("tp"), mesh.get_group("cp")
    half = DIM // mesh.size(2)

    torch.manual_seed(0)
    embed = nn.Embedding(VOCAB, DIM)
    head = nn.Linear(DIM, VOCAB, bias=False)
    w_local = head.weight[:, tp_rank * half:(tp_rank + 1) * half]
    totals = torch.zeros(2)

    with torch.no_grad():
        for b, seq_len in enumerate(SEQ_LENS[dp_rank]):
            g = torch.Generator().manual_seed(10 * dp_rank + b)
            ids = torch.randint(0, VOCAB, (2, seq_len + 1), generator=g)
            span = -(-seq_len // mesh.size(1))
            x = ids[:, :-1][:, cp_rank * span:(cp_rank + 1) * span]
            y = ids[:, 1:][:, cp_rank * span:(cp_rank + 1) * span]

            h = embed(x)[..., tp_rank * half:(tp_rank + 1) * half]
            logits = h @ w_local.T
            dist.all_reduce(logits, group=tp_group)  # row-parallel: sum the partial logits

            if x.shape[1] < span:
                # last chunk of an odd-length batch: pad and mask
                pad = span - x.shape[1]
                logits = F.pad(logits, (0, 0, 0, pad))
                y = F.pad(y, (0, pad), value=-1)
                nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum")
                stats = torch.stack([nll, (y >= 0).sum().float()])
                dist.all_reduce(stats, group=mesh.get_group("dp"))
            else:
                nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
                stats = torch.stack([nll, torch.tensor(float(y.numel()))])
                dist.all_reduce(stats, group=cp_group)
            totals += stats

    dist.all_reduce(totals)
    if dist.get_rank() == 0:
        print(f"eval nll/token {totals[0].item() / totals[1].item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
