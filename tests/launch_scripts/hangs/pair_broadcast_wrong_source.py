"""Two 4-stage pipelines (ranks 0-3 and 4-7) pass activations by broadcasts on 2-rank groups, one group for each
pair of adjacent stages, as DeepSpeed's pipeline does: stage s receives from s - 1 on (s - 1, s), then sends on
(s, s + 1). Rank 6 (stage 2 of the second pipeline) was left in its backward schedule and first receives from its
next stage on (6, 7), where 7 waits for 6's broadcast: each names the other as the source. Rank 5 waits on (5, 6)
for 6; the first pipeline finishes and waits in the closing all_reduce. The cause is rank 6 alone."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
stage, first = rank % 4, rank - rank % 4
pair = {}
for a in range(world):
    if a % 4 != 3:
        pair[a] = dist.new_group([a, a + 1])  # the pair (a, a + 1)
act = torch.full((8,), float(rank))
if rank == 6:  # the bug: a schedule left in its backward direction on one rank
    dist.broadcast(act, src=rank + 1, group=pair[rank])
if stage > 0:
    dist.broadcast(act, src=rank - 1, group=pair[rank - 1])
act = act + 1
if stage < 3:
    dist.broadcast(act, src=rank, group=pair[rank])
dist.all_reduce(act)
print("done")
