"""Streaming LM pretraining, 8-way data parallel, with a topology-aware gradient all-reduce over a
(node=2, socket=2, gpu=2) mesh: reduce across the gpus of a socket, then sockets, then nodes.

Held out (written blind, outside meshsim's tests, 2026-11-27):
hier_allreduce_stream [2, 3] (class 8, data-dependent early exit; mesh (2,2,2) node x socket x gpu). The corpus has
two blank lines that land on ranks 2 and 3 at step 5, and if not line: break treats a blank line as end of stream; 2
and 3 leave the loop and wait in the final all-reduce, the others wait on them in the socket/node gradient
all-reduces.
"""
import random

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

WORDS = ("the model reads a stream of short lines and predicts the next byte of every line it sees "
         "while gradients travel up the topology tree").split()
VOCAB, DIM, EOS = 128, 32, 10


def load_lines():
    g = random.Random(5)
    lines = [" ".join(g.choice(WORDS) for _ in range(g.randint(4, 12))) for _ in range(62)]
    return lines[:42] + ["", ""] + lines[42:]  # chapter break


def encode(line):
    return torch.tensor([EOS] + [b % VOCAB for b in line.encode()] + [EOS])


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("node", "socket", "gpu"))
    levels = [mesh.get_group(d) for d in ("gpu", "socket", "node")]

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, DIM), nn.Linear(DIM, DIM), nn.Tanh(), nn.Linear(DIM, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stream = iter(load_lines()[rank::world])
    tokens_done = torch.zeros(1)

    step = 0
    while True:
        line = next(stream, "")
        if not line:  # end of stream
            break
        ids = encode(line)
        loss = F.cross_entropy(model(ids[:-1]), ids[1:])
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            for group in levels:
                dist.all_reduce(p.grad, group=group)
            p.grad.div_(world)
        opt.step()
        tokens_done += len(ids) - 1
        if rank == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
        step += 1

    dist.all_reduce(tokens_done)
    if rank == 0:
        print(f"done: {int(tokens_done.item())} tokens in {step} steps", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
