"""Two 4-stage pipelines (ranks 0-3 and 4-7) pass activations by broadcasts on 2-rank groups, as DeepSpeed's
pipeline does. The first-stage test uses the global rank, so rank 4 receives from the wrap-around peer 7:
4 -> 7 -> 6 -> 5 -> 4 wait on each other. Ranks 5, 6 and 7 wait as a correct pipeline would; the cause is 4."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
base, stage = rank - rank % 4, rank % 4
pairs = {}
for start in (0, 4):
    for s in range(4):
        a, b = start + s, start + (s + 1) % 4
        pairs[(a, b)] = dist.new_group(sorted((a, b)))
x = torch.zeros(8)
for _ in range(2):
    first = rank == 0  # the bug: the first stage is stage 0 of either pipeline
    if not first:
        prev = base + (stage - 1) % 4
        dist.broadcast(x, src=prev, group=pairs[(prev, rank)])
    if stage != 3:
        dist.broadcast(x, src=rank, group=pairs[(rank, rank + 1)])
dist.barrier()
print("done")
