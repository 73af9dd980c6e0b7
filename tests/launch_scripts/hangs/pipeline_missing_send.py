"""A pipeline of world stages: each stage receives activations from the previous one and sends to the next.
Stage 1 drops the send of its last microbatch, so stage 2 waits in recv (and every later stage behind it)."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for micro in range(3):
    act = torch.full((4,), float(micro))
    if rank > 0:
        dist.recv(act, src=rank - 1)
    if rank < world - 1 and not (rank == 1 and micro == 2):
        dist.send(act + 1, dst=rank + 1)
print("stage done")
