"""A simulated GPU's memory and NCCL's facts, checked on a simulated host (tests/test_simgpu_memory.py runs it on
2 hosts x 2 GPUs of 64 MiB each).

Each check returns a JSON-able value; the rank prints one line `RESULTS <json>` (a check that raised gives
"error: <type>: <message>").
"""

import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from checklist import check, raises, report

LOCAL_RANK = int(os.environ["LOCAL_RANK"])
MiB = 1 << 20


@check
def bound_device_and_timeouts():
    """init_process_group(device_id=...) binds the group to the rank's GPU; torch's own code that follows from NCCL
    being available (per-group timeouts, barrier on a device) works."""
    from torch.distributed.distributed_c10d import _get_default_group, _set_pg_timeout

    dist.init_process_group("nccl", device_id=torch.device("cuda", LOCAL_RANK))
    _set_pg_timeout(timedelta(seconds=120))
    group = dist.new_group([0, 1, 2, 3])
    _set_pg_timeout(timedelta(seconds=90), group)
    dist.barrier(device_ids=[LOCAL_RANK])
    dist.barrier()
    dist.barrier(group=group)
    bound = _get_default_group().bound_device_id
    return [str(bound), dist.is_nccl_available(), isinstance(_get_default_group(), dist.ProcessGroup)]


@check
def reduce_ops_as_on_nccl():
    """Every reduce op NCCL has, on every path: torch.distributed, the functional collectives and their ops."""
    import torch.distributed._functional_collectives as funcol

    rank, world = dist.get_rank(), dist.get_world_size()
    values = {}
    for name in ("SUM", "AVG", "MIN", "MAX", "PRODUCT"):
        tensor = torch.full((2,), float(rank + 1), device="cuda")
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, name))
        values[name] = tensor.tolist()
    # (torch 2.9 and 2.10 make a PREMUL_SUM through the private helper; later releases call the enum member)
    make_premul = dist.ReduceOp.PREMUL_SUM if callable(dist.ReduceOp.PREMUL_SUM) else dist._make_nccl_premul_sum
    premul = make_premul(0.5)
    tensor = torch.full((2,), float(rank + 1), device="cuda")
    dist.all_reduce(tensor, op=premul)
    values["PREMUL_SUM"] = tensor.tolist()
    source = torch.arange(float(world * 2), device="cuda")
    kept = source.clone()
    out = torch.empty(2, device="cuda")
    dist.reduce_scatter_tensor(out, source, op=make_premul(0.25))
    values["reduce_scatter_premul"] = out.tolist()
    values["input_unchanged"] = bool(torch.equal(source, kept))
    if hasattr(dist, "reduce_scatter_single"):
        single = torch.empty(2, device="cuda")
        dist.reduce_scatter_single(single, source, op=make_premul(0.25))
        values["reduce_scatter_single_premul"] = single.tolist()
    values["functional_avg"] = funcol.all_reduce(torch.full((2,), float(rank), device="cuda"), "avg",
                                                 dist.group.WORLD).tolist()
    group_name = dist.group.WORLD.group_name
    waited = torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.reduce_scatter_tensor(
        torch.ones(world * 2, device="cuda") * rank, "avg", world, group_name))
    values["c10d_functional_reduce_scatter_avg"] = waited.tolist()
    return values


@check
def allocator_arithmetic():
    """One tensor: its bytes rounded up to 512, in a 2 MiB small-pool segment, freed to the cache, then released."""
    torch.cuda.empty_cache()
    base, reserved0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    # a block still live in the small pool keeps its 2 MiB segment, where the 4 KiB block then fits (torch 2.9's
    # barrier(device_ids=...) leaves one on rank 0, as it would on a GPU)
    small_live = torch.cuda.memory_stats()["allocated_bytes.small_pool.current"] > 0
    torch.cuda.reset_peak_memory_stats()
    x = torch.empty(1000, device="cuda")  # 4,000 bytes -> a 4,096-byte block
    y = torch.empty(3 * MiB // 4, device="cuda")  # 3 MiB -> a 20 MiB large-pool segment
    during = [torch.cuda.memory_allocated() - base, torch.cuda.memory_reserved() - reserved0]
    del x, y
    after = [torch.cuda.memory_allocated() - base, torch.cuda.memory_reserved() - reserved0,
             torch.cuda.max_memory_allocated() - base]
    torch.cuda.empty_cache()
    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {"during": during, "after": after, "small_segment_cached": small_live,
            "emptied": torch.cuda.memory_reserved() - reserved0,
            "keys": sorted(k for k in stats if k.startswith(("active_bytes.all", "reserved_bytes.all", "num_"))),
            "free_plus_reserved": free + torch.cuda.memory_reserved(), "total": total,
            "properties": [torch.cuda.get_device_properties(LOCAL_RANK).total_memory, torch.cuda.get_device_name()],
            "summary": "PyTorch CUDA memory summary" in torch.cuda.memory_summary()}


@check
def copies_that_name_their_own_device():
    """A GPU tensor reports device cpu, so type_as and to(x.device, dtype) name the CPU: the copy is on the
    GPU (counted), as on a GPU; a host tensor's copy stays host memory."""
    a, b = torch.randn(1000, device="cuda"), torch.zeros(1, device="cuda", dtype=torch.bfloat16)
    host = torch.randn(1000)
    found = {}
    for name, make in [("type_as", lambda: a.type_as(b)), ("to_own_device", lambda: a.to(a.device, torch.bfloat16)),
                       ("host_type_as", lambda: host.type_as(b))]:
        before = torch.cuda.memory_allocated()
        copy = make()
        found[name] = torch.cuda.memory_allocated() - before
        del copy
    return found


@check
def each_operator_counted_by_what_it_allocates():
    """Views, in-place operators and copies into a host tensor allocate nothing on the GPU; a new result, an out=
    buffer on the host that GPU inputs write into, and a storage's resize_ do, each its block; a training loop's
    memory stays level from one step to the next (meshsim.compat.simgpu.memory skips what cannot allocate)."""
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")  # 16 KiB blocks
    host = torch.empty(64, 64)
    found = {}

    def delta(name, make):
        before = torch.cuda.memory_allocated()
        kept = make()
        found[name] = torch.cuda.memory_allocated() - before
        return kept

    delta("views", lambda: [a.t(), a.view(-1), a.detach(), a.expand(2, 64, 64), *a.split(16), a[3:], a.T.T])
    delta("in_place", lambda: (a.add_(1), a.mul_(b), a.relu_(), torch.mul(a, b, out=a)))
    delta("copy_to_host", lambda: host.copy_(a))
    delta("host_op", lambda: host + host)
    out = delta("new_result", lambda: a @ b)
    delta("out_into_host_buffer", lambda: torch.mul(a, b, out=torch.empty(64, 64)))
    delta("resize_", lambda: out.untyped_storage().resize_(64 * 64 * 4 * 2))
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    steps = []
    for _ in range(4):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(a), torch.zeros(64, dtype=torch.long, device="cuda")).backward()
        optimizer.step()
        steps.append(torch.cuda.memory_allocated())
    found["steps_level"] = len(set(steps[1:])) == 1
    return found


def _mlp(width=256, layers=4):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])


def _train(model, batch, steps=2):
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # gradients stay: they count
    return optimizer


def _local_bytes(model):
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
               for p in model.parameters())


@check
def fsdp_and_tp_memory_is_parameters_gradients_and_adam_states():
    """After training, a rank holds its shards of the parameters, their gradients and Adam's two states: 4x the
    local parameter bytes, plus the batch, on FSDP2 over 4 ranks and on FSDP2 x TP over (2, 2)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    figures = {}
    for name in ("fsdp", "fsdp_tp"):
        gc.collect()  # FSDP's hooks hold a model in reference cycles: the collector frees it, as on a GPU
        base = torch.cuda.memory_allocated()
        model = _mlp().cuda()
        if name == "fsdp":
            mesh = init_device_mesh("cuda", (4,))
            for layer in model:
                fully_shard(layer, mesh=mesh)
        else:
            mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
            parallelize_module(model, mesh["tp"], {str(i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel()
                                                   for i in range(4)})
            for layer in model:
                fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh if name == "fsdp" else mesh["dp"])
        batch = torch.randn(8, 256, device="cuda")
        optimizer = _train(model, batch)
        figures[name] = {"measured": torch.cuda.memory_allocated() - base,
                         "arithmetic": 4 * _local_bytes(model) + batch.numel() * 4,
                         "peak_above": torch.cuda.max_memory_allocated() - base}
        del model, optimizer, batch, layer  # the last layer holds the whole FSDP module through its state
        gc.collect()
        figures[name]["left"] = torch.cuda.memory_allocated() - base
    return figures


@check
def out_of_memory_as_cuda():
    """Past the 64 MiB capacity: torch.OutOfMemoryError with CUDA's message, counted; the memory stays usable."""
    before = torch.cuda.memory_stats()["num_ooms"]
    error = raises(lambda: torch.empty(100 * MiB, dtype=torch.uint8, device="cuda"))
    model = nn.Linear(1024, 1024).cuda()
    grown = raises(lambda: [torch.empty_like(model.weight) for _ in range(40)])  # 40 x 4 MiB, derived
    after = torch.cuda.memory_stats()
    return {"error": error, "derived": grown.split(".")[0], "ooms": after["num_ooms"] - before,
            "retries": after["num_alloc_retries"] > 0, "still_usable": torch.ones(4, device="cuda").sum().item()}


@check
def host_copies_are_their_own_memory():
    """.cpu(), .to("cpu") and pin_memory() copy to the host: the GPU's bytes are freed with the GPU tensor, and
    writing a copy leaves the other; .cuda() of a host tensor copies it to the GPU (the host buffer is reusable)."""
    base = torch.cuda.memory_allocated()
    gpu = torch.ones(1024, device="cuda")  # 4 KiB
    host, to_host, pinned = gpu.cpu(), gpu.to("cpu"), gpu.pin_memory()
    host.add_(1), to_host.add_(1), pinned.add_(1)
    written = gpu.sum().item()
    itself = [gpu.cuda() is gpu, gpu.to("cuda") is gpu, gpu.to(LOCAL_RANK) is gpu]  # no copy: already there
    del gpu
    freed = torch.cuda.memory_allocated() - base
    buffer = torch.zeros(1024, pin_memory=True)
    on_gpu = buffer.cuda(non_blocking=True)
    buffer.fill_(7.0)  # the next batch into the same pinned buffer
    return {"written": written, "itself": itself, "freed": freed, "host_values": host.sum().item(),
            "pinned": [pinned.is_pinned(), buffer.is_pinned(), host.is_pinned()],
            "transfer": [on_gpu.sum().item(), torch.cuda.memory_allocated() - base]}


report(900)
