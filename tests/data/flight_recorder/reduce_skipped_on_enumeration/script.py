"""Per-language eval on 8 ranks: ranks are grouped by language (even ranks: en, odd ranks: de) with
new_subgroups_by_enumeration; each group reduces its loss sums to the group's first rank, which reports them."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

DIM, N_CLASSES = 12, 3
# documents per rank after length filtering (max 64 tokens); rank r reads docs r, r+8, ...
DOC_LENGTHS = [40, 52, 33, 70, 61, 18, 90, 27, 45, 12, 58, 81, 30, 44, 77, 63]
MAX_TOKENS = 64


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    lang_group, _ = dist.new_subgroups_by_enumeration([list(range(0, world, 2)), list(range(1, world, 2))])
    lang = ("en", "de")[rank % 2]
    lead = dist.get_global_rank(lang_group, 0)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, N_CLASSES)).eval()
    docs = [n for n in DOC_LENGTHS[rank::world] if n <= MAX_TOKENS]

    loss_sum = torch.zeros(2)
    with torch.no_grad():
        for i, n_tokens in enumerate(docs):
            g = torch.Generator().manual_seed(1000 * rank + i)
            feats = torch.randn(n_tokens, DIM, generator=g)
            labels = torch.randint(0, N_CLASSES, (n_tokens,), generator=g)
            loss_sum += torch.tensor([F.cross_entropy(model(feats), labels, reduction="sum").item(), n_tokens])

    if docs:  # a rank whose documents were all filtered out has nothing to add
        dist.reduce(loss_sum, dst=lead, group=lang_group)
        if rank == lead:
            print(f"[{lang}] loss/token {loss_sum[0].item() / loss_sum[1].item():.4f}", flush=True)

    done = torch.ones(1)
    dist.all_reduce(done, group=mesh.get_group("dp"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
