"""Tensor-parallel MLP regression on a 4 x 2 (dp, tp) mesh with periodic loss / throughput logging.

Held out (written blind, outside meshsim's tests, 2026-11-27):
tp_throughput_logging [0, 1] (class 1, extra collective; mesh (4,2) dp x tp). At the step-3 log, only the first
replica (dp_rank 0 = ranks 0, 1) all-reduces the throughput on its dp group, an extra call its dp peers never make;
those peers go on to the world loss all-reduce and wait there for ranks 0 and 1.
"""
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

HIDDEN, FFN, BATCH, STEPS, LOG_EVERY = 32, 64, 16, 6, 3


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
    dp_group, tp_group = mesh.get_group("dp"), mesh.get_group("tp")
    dp_rank, tp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    dp_size, tp_size = mesh.size(0), mesh.size(1)

    # column-parallel up projection, row-parallel down projection
    torch.manual_seed(0)
    w_up = torch.randn(HIDDEN, FFN).div(HIDDEN ** 0.5).chunk(tp_size, dim=1)[tp_rank].clone().requires_grad_()
    w_down = torch.randn(FFN, HIDDEN).div(FFN ** 0.5).chunk(tp_size, dim=0)[tp_rank].clone().requires_grad_()
    params = [w_up, w_down]
    opt = torch.optim.AdamW(params, lr=3e-3)

    gen = torch.Generator().manual_seed(1234 + dp_rank)
    teacher = torch.randn(HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(7))
    samples_seen, t_start = 0, time.perf_counter()

    for step in range(1, STEPS + 1):
        x = torch.randn(BATCH, HIDDEN, generator=gen)
        y = torch.tanh(x @ teacher)

        partial = F.gelu(x @ w_up) @ w_down
        summed = partial.detach().clone()
        dist.all_reduce(summed, group=tp_group)
        out = partial + (summed - partial).detach()  # forward sees the full sum, backward the local shard
        loss = F.mse_loss(out, y)

        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in params:
            dist.all_reduce(p.grad, group=dp_group)
            p.grad.div_(dp_size)
        opt.step()
        samples_seen += BATCH

        if step % LOG_EVERY == 0:
            if dp_rank == 0:
                # first replica reports the job-wide throughput
                rate = torch.tensor([samples_seen / (time.perf_counter() - t_start)])
                dist.all_reduce(rate, group=dp_group)
                print(f"step {step} tp{tp_rank}: {rate.item():.1f} samples/s over {dp_size} replicas", flush=True)
            mean_loss = loss.detach().reshape(1)
            dist.all_reduce(mean_loss)
            if dist.get_rank() == 0:
                print(f"step {step} loss {mean_loss.item() / dist.get_world_size():.4f}", flush=True)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
