"""Interleaved pipeline (4 stages per host, 2 model chunks per stage) evaluated with send/recv, 2 data-parallel
replicas (one per host) on a (dp=2, pp=4) mesh. Chunk 0 runs stages 0..3, then wraps to stage 0 for chunk 1.

Held out (written blind, outside meshsim's tests, 2026-11-27):
interleaved_pp_eval [7] (class 5, pipeline cycle, send/recv; mesh (2,4) dp x pp). The wrap-around send of the last
stage uses (rank + 1) % pp_size, right for rank 3 (-> 0) but wrong for rank 7 (-> 0 instead of 4): 4 waits to recv
from 7, 7 waits on its send to 0, 0 waits for 4 in the dp all-reduce.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

DIM, MICRO, N_MICRO, N_CHUNKS = 32, 4, 3, 2


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "pp"))
    dp_rank, stage = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
    pp_size = mesh.size(1)
    dp_group = mesh.get_group("dp")

    # layer (chunk * pp_size + stage) of an 8-layer MLP lives on this stage
    chunks = []
    for c in range(N_CHUNKS):
        torch.manual_seed(c * pp_size + stage)
        chunks.append(nn.Sequential(nn.Linear(DIM, DIM), nn.GELU()))
    head = nn.Linear(DIM, 1)

    is_first, is_last = stage == 0, stage == pp_size - 1
    g = torch.Generator().manual_seed(dp_rank)
    total = torch.zeros(2)
    with torch.no_grad():
        for _micro in range(N_MICRO):
            x = torch.randn(MICRO, DIM, generator=g)
            y = x.sum(-1, keepdim=True)
            for c in range(N_CHUNKS):
                if is_first and c == 0:
                    act = x
                else:
                    act = torch.empty(MICRO, DIM)
                    src = rank - 1 if not is_first else rank + pp_size - 1
                    dist.recv(act, src=src)
                act = chunks[c](act)
                if is_last and c == N_CHUNKS - 1:
                    total += torch.tensor([nn.functional.mse_loss(head(act), y).item(), 1.0])
                elif not is_last:
                    dist.send(act, dst=rank + 1)
                else:
                    dist.send(act, dst=(rank + 1) % pp_size)  # wrap around to the first stage
    # the last stage of each replica holds the loss; sum it across replicas stage by stage
    dist.all_reduce(total, group=dp_group)
    if is_last and dp_rank == 0:
        print(f"eval mse {total[0].item() / total[1].item():.4f} over {int(total[1].item())} micro-batches", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
