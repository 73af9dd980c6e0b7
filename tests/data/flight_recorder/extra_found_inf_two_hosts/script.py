"""Column-parallel regression head trained with a static loss scale and fp16-emulated gradients on a
(dp=2, tp=4) mesh. A tp shard whose gradients overflow makes its tp group skip the step."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

IN, OUT, BATCH, STEPS, LOSS_SCALE = 16, 32, 8, 5, 1024.0
# (replica, step) -> column of a target that arrives corrupted (sensor glitch in the logs)
GLITCHES = {(0, 3): 20, (1, 3): 13}


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    dp_rank, tp_rank, tp_size = mesh.get_local_rank("dp"), mesh.get_local_rank("tp"), mesh.size(1)
    tp_group, dp_group = mesh.get_group("tp"), mesh.get_group("dp")
    cols = OUT // tp_size

    torch.manual_seed(0)
    w = torch.randn(IN, OUT).div(IN ** 0.5)[:, tp_rank * cols:(tp_rank + 1) * cols].clone().requires_grad_()
    opt = torch.optim.SGD([w], lr=0.05)
    g = torch.Generator().manual_seed(dp_rank)
    skipped = 0

    for step in range(STEPS):
        x = torch.randn(BATCH, IN, generator=g)
        y = torch.randn(BATCH, OUT, generator=g)
        if (dp_rank, step) in GLITCHES:
            y[0, GLITCHES[(dp_rank, step)]] = 3.0e4
        y_local = y[:, tp_rank * cols:(tp_rank + 1) * cols]

        loss = F.mse_loss(x @ w, y_local, reduction="sum") / BATCH
        opt.zero_grad()
        (loss * LOSS_SCALE).backward()
        grad16 = w.grad.half()  # what the fp16 grad buffer would hold

        found_inf = torch.zeros(1)
        if not torch.isfinite(grad16).all():
            found_inf.fill_(1.0)
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=tp_group)  # whole tp group skips
        if found_inf.item() == 0:
            w.grad = grad16.float() / LOSS_SCALE
            dist.all_reduce(w.grad, group=dp_group)
            w.grad /= mesh.size(0)
            opt.step()
        else:
            skipped += 1

        report = loss.detach().reshape(1)
        dist.all_reduce(report)
        if dist.get_rank() == 0:
            print(f"step {step} loss {report.item() / 8:.3f} skipped {skipped}", flush=True)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
