"""Megatron-style groups built by hand: 2 replicas x 4-way tensor parallel, each rank picking its TP group in the
loop that makes them all. The membership test `ranks[0] <= rank < ranks[-1]` leaves out the last rank of each group
(3 and 7): they keep tp_group = None and sum their partial outputs over the world group, while each TP group waits
for its last member. Two sibling groups hang alike, each with its own culprit: ranks 3 and 7."""
import torch
import torch.distributed as dist

TP = 4
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
tp_group = None
for d in range(world // TP):
    ranks = list(range(d * TP, (d + 1) * TP))
    group = dist.new_group(ranks)
    if ranks[0] <= rank < ranks[-1]:  # the bug: `<=`
        tp_group = group
partial = torch.full((4,), float(rank))
dist.all_reduce(partial, group=tp_group)
dist.all_reduce(torch.ones(1))  # the loss, averaged over the world
