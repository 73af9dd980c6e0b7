"""Two 2-stage pipelines (stage 0 is ranks 0 and 1, stage 1 ranks 2 and 3, one of each per replica) pass two
micro-batches forward under tags 0 and 1 and their gradients back under tags 10 and 11. Stage 0 (ranks 0 and 1)
posts its gradient receives under the forward tags, which already carried a message between the two stages. gloo
pairs a send with the receive of its own tag: stage 1 waits to send tag 11, stage 0 to receive tag 1. The cause is
stage 0's receives: ranks 0 and 1."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
stage, replica = rank // 2, rank % 2
peer = 2 + replica if stage == 0 else replica
FORWARD, BACKWARD = 0, 10
x = torch.ones(4)
for mb in range(2):
    if stage == 0:
        dist.send(x * mb, dst=peer, tag=FORWARD + mb)
    else:
        dist.recv(x, src=peer, tag=FORWARD + mb)
for mb in reversed(range(2)):
    if stage == 1:
        dist.send(x * 2, dst=peer, tag=BACKWARD + mb)
    else:
        dist.recv(x, src=peer, tag=FORWARD + mb)  # the bug: the gradients' tags are BACKWARD + mb
dist.barrier()
dist.destroy_process_group()
