"""8-stage GPipe pipeline (one stage per rank) with point-to-point send/recv.

Layers are partitioned over stages; a stage whose share exceeds the memory budget keeps only
its input activations and recomputes the forward in the backward pass.

Held out (written blind, outside meshsim's tests, 2026-11-27; undecided blind: the waits form a chain of receives
in which each pair looked like two calls in opposite orders). The recompute path of stage 5, the only stage that
holds the spare layer, posts its gradient irecv from the previous stage instead of the next: 4 and 5 wait on each
other and the rest wait in a chain. Culprit 5.
"""

import os

import torch
import torch.distributed as dist

LAYERS, HIDDEN, MICRO, MB_SIZE, STEPS = 25, 16, 2, 4, 3
MAX_LAYERS_STORED = 3


def partition(n_layers, n_stages):
    base, extra = divmod(n_layers, n_stages)
    # the spare layer goes to a late-middle stage: the first/last stages also hold embedding/head
    return [base + (1 if s == n_stages - 3 and extra else 0) for s in range(n_stages)]


class Stage:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.prev = rank - 1 if rank > 0 else None
        self.next = rank + 1 if rank < world - 1 else None
        torch.manual_seed(rank)
        self.weights = [torch.randn(HIDDEN, HIDDEN) * 0.2 for _ in range(partition(LAYERS, world)[rank])]
        self.recompute = len(self.weights) > MAX_LAYERS_STORED
        self.saved = {}

    def forward(self, x, mb=None):
        out = x
        for w in self.weights:
            out = torch.tanh(out @ w)
        if mb is not None and not self.recompute:
            self.saved[mb] = out
        return out

    def backward_step(self, x_in, mb):
        if self.next is None:
            grad = torch.ones(MB_SIZE, HIDDEN) / MB_SIZE
            out = self.saved.pop(mb) if not self.recompute else self.forward(x_in)
        elif self.recompute:
            # overlap the recomputation with the incoming gradient
            grad = torch.empty(MB_SIZE, HIDDEN)
            req = dist.irecv(grad, src=self.prev)
            out = self.forward(x_in)
            req.wait()
        else:
            grad = torch.empty(MB_SIZE, HIDDEN)
            dist.recv(grad, src=self.next)
            out = self.saved.pop(mb)
        grad_in = grad * (1 - out.pow(2)) @ self.weights[0].t()
        if self.prev is not None:
            dist.send(grad_in.contiguous(), dst=self.prev)
        return grad_in.abs().mean().item()


def main():
    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    stage = Stage(rank, world)
    for step in range(STEPS):
        inputs = []
        for mb in range(MICRO):
            if stage.prev is None:
                torch.manual_seed(100 * step + mb)
                x = torch.randn(MB_SIZE, HIDDEN)
            else:
                x = torch.empty(MB_SIZE, HIDDEN)
                dist.recv(x, src=stage.prev)
            inputs.append(x)
            y = stage.forward(x, mb)
            if stage.next is not None:
                dist.send(y.contiguous(), dst=stage.next)
        g = 0.0
        for mb in reversed(range(MICRO)):
            g += stage.backward_step(inputs[mb], mb)
        stat = torch.tensor([g])
        dist.all_reduce(stat)
        if rank == 0:
            print(f"step {step} grad stat {stat.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
