"""Only ranks 0 and 1 call new_group([0, 1]) (the classic mistake: every rank must call new_group, members or
not). torch does not wait in new_group, so nothing hangs there: ranks 2 and 3 are one group behind, and the next
group that spans both sides, new_group([0, 2]), has another name on rank 2 than on rank 0, so its creation waits
for a peer that registered under the other name."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(2)
if rank in (0, 1):
    pair = dist.new_group([0, 1])
    dist.all_reduce(x, group=pair)
cross = dist.new_group([0, 2])
if rank in (0, 2):
    dist.all_reduce(x, group=cross)
print("done")
