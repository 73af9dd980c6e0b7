"""Eight ranks pass a halo around a ring with batch_isend_irecv, share a boundary value with their pair partner by
a broadcast on 2-rank groups, then all_reduce a residual on the world. On its first exchange rank 5 also sends a
correction to its right neighbour 6, which no rank receives: rank 5 waits on that send, its partner 4 in their
broadcast, every other rank in the residual all_reduce. The cause is rank 5's one send more."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
right, left = (rank + 1) % world, (rank - 1) % world
pairs = [dist.new_group([2 * i, 2 * i + 1]) for i in range(world // 2)]
halo, edge, boundary = torch.full((2,), float(rank)), torch.zeros(2), torch.zeros(1)
for step in range(2):
    ops = [dist.P2POp(dist.isend, halo, right), dist.P2POp(dist.irecv, edge, left)]
    if step == 0 and rank == 5:
        ops.append(dist.P2POp(dist.isend, halo.clone(), right))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    dist.broadcast(boundary, src=rank - rank % 2, group=pairs[rank // 2])
    residual = (edge - halo).abs().sum().reshape(1)
    dist.all_reduce(residual)
print("done")
