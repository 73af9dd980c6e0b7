"""Interleaved 4-stage pipeline per host (2 model chunks per stage), activations passed by broadcast on one
2-rank group per link, 2 data-parallel replicas on a (dp=2, pp=4) mesh. Forward-only eval."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

DIM, MICRO, N_MICRO, N_CHUNKS = 24, 4, 3, 2


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "pp"))
    dp_rank, stage, pp_size = mesh.get_local_rank("dp"), mesh.get_local_rank("pp"), mesh.size(1)

    # a 2-rank group for every link s -> s+1 (mod pp) of every replica's pipeline, created in the same order
    links = {}
    for row in mesh.mesh.tolist():
        for s in range(pp_size):
            a, b = row[s], row[(s + 1) % pp_size]
            links[(a, b)] = dist.new_group([a, b])
    pipeline = mesh["pp"].mesh.tolist()
    prev_rank, next_rank = pipeline[(stage - 1) % pp_size], pipeline[(stage + 1) % pp_size]

    chunks = []
    for c in range(N_CHUNKS):
        torch.manual_seed(100 * c + stage)
        chunks.append(nn.Sequential(nn.Linear(DIM, DIM), nn.SiLU()))
    reads_data = rank == 0  # the first stage reads the batch
    is_last = stage == pp_size - 1

    g = torch.Generator().manual_seed(dp_rank)
    loss_sum = torch.zeros(1)
    with torch.no_grad():
        for m in range(N_MICRO):
            x = torch.randn(MICRO, DIM, generator=g)
            for c in range(N_CHUNKS):
                if reads_data and c == 0:
                    act = x
                else:
                    act = torch.empty(MICRO, DIM)
                    dist.broadcast(act, src=prev_rank, group=links[(prev_rank, rank)])
                act = chunks[c](act)
                if is_last and c == N_CHUNKS - 1:
                    loss_sum += F.mse_loss(act, torch.zeros_like(act))
                else:
                    dist.broadcast(act, src=rank, group=links[(rank, next_rank)])

    dist.all_reduce(loss_sum, group=mesh.get_group("dp"))
    if is_last and dp_rank == 0:
        print(f"eval loss {loss_sum.item() / (N_MICRO * mesh.size(0)):.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
