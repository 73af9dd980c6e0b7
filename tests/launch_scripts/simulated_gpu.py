"""What a GPU script relies on, checked on a simulated host (run by tests/test_simgpu.py on 2 hosts x 2 GPUs).

Each check returns a JSON-able value; the rank prints one line `RESULTS <json>` with every check's value (or
"error: <type>: <message>" where it raised), and the tests read it back.
"""

import io
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from checklist import check, raises, report

LOCAL_RANK = int(os.environ["LOCAL_RANK"])


@check
def lazy_init_then_device_mesh_sets_local_rank():
    before = torch.cuda.is_initialized()
    dist.init_process_group("nccl")
    from torch.distributed.device_mesh import init_device_mesh

    global MESH
    MESH = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
    return [before, torch.cuda.current_device(), torch.cuda.is_initialized()]


@check
def device_forms():
    x = torch.ones(3)
    buf = io.BytesIO()
    torch.save({"w": x * 2}, buf)

    def load(location):
        buf.seek(0)
        return torch.load(buf, map_location=location)["w"].tolist()

    made = {
        "to_int": x.to(LOCAL_RANK), "to_kw": x.to(device=LOCAL_RANK, non_blocking=True), "cuda_i": x.cuda(LOCAL_RANK),
        "cuda": x.cuda(), "module_to_int": nn.Linear(2, 2).to(0).weight, "module_cuda": nn.Linear(2, 2).cuda().weight,
        "pin_memory": x.pin_memory(), "zeros_int": torch.zeros(2, device=LOCAL_RANK),
        "zeros_str": torch.zeros(2, device=f"cuda:{LOCAL_RANK}"), "randn_bare": torch.randn(2, device="cuda"),
        "tensor_bare": torch.tensor([1.0], device="cuda"), "full_device": torch.full((2,), 1.0,
                                                                                        device=torch.device(0)),
    }
    return {
        "placed": {name: str(t.device) for name, t in made.items()},
        "device_int": str(torch.device(LOCAL_RANK)),
        "loads": [load(loc) for loc in ("cuda:0", "cuda", {"cuda:0": "cuda:1"}, torch.device("cuda", 1),
                                        lambda storage, where: storage.cuda(LOCAL_RANK))],
    }


@check
def invalid_ordinals():
    x = torch.ones(1)
    return {
        "set_device": raises(lambda: torch.cuda.set_device(2)),
        "to": raises(lambda: x.to(2)),
        "cuda": raises(lambda: x.cuda(2)),
        "zeros": raises(lambda: torch.zeros(1, device="cuda:2")),
        "module_to": raises(lambda: nn.Linear(1, 1).to(2)),
        "accelerator": raises(lambda: torch.accelerator.set_device_index(2)),
        "load": raises(lambda: torch.load(io.BytesIO(_saved(x)), map_location="cuda:2")),
        "ddp": raises(lambda: torch.nn.parallel.DistributedDataParallel(nn.Linear(1, 1), device_ids=[2])),
    }


def _saved(x):
    buf = io.BytesIO()
    torch.save(x, buf)
    return buf.getvalue()


@check
def device_index_contexts():
    seen = []
    with torch.accelerator.device_index(1):
        seen.append(torch.cuda.current_device())
    seen.append(torch.cuda.current_device())
    with torch.cuda.device(1):
        seen.append(torch.accelerator.current_device_index())
    seen.append(torch.accelerator.current_device_index())
    return seen


@check
def optimizer_flags_agree():
    """Every optimizer flag combination takes the same steps as the plain for-loop one (what a GPU guarantees)."""
    results = {}
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
        variants = [{}, {"foreach": True}, {"fused": True}]
        if cls is not torch.optim.SGD:
            variants.append({"capturable": True})
        finals = {}
        for flags in variants:
            torch.manual_seed(0)
            model = nn.Linear(4, 3).cuda()
            kwargs = {"lr": 0.1, **({"momentum": 0.9} if cls is torch.optim.SGD else {})}
            opt = cls(model.parameters(), **kwargs, **flags)
            for _ in range(3):
                model(torch.ones(2, 4, device="cuda")).pow(2).sum().backward()
                opt.step()
                opt.zero_grad()
            finals[json.dumps(flags)] = model.weight.detach().clone()
        base = finals["{}"]
        results[cls.__name__] = {k: float((v - base).abs().max()) for k, v in finals.items()}
    return results


@check
def dtensor_random_init():
    """uniform_ on a DTensor sharded over tp and replicated over dp: replicas equal, shards differ, the RNG states
    stay equal on every rank, and the same seed gives the same values again."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def draw():
        torch.manual_seed(5)
        dt = distribute_tensor(torch.zeros(8, 4, device="cuda"), MESH, [Replicate(), Shard(0)])
        dt.uniform_()
        return dt.to_local().clone()

    first, second = draw(), draw()
    state = torch.cuda.get_rng_state()
    gathered = [torch.zeros_like(first) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, first)
    states = [torch.zeros_like(state) for _ in range(dist.get_world_size())]
    dist.all_gather(states, state)
    return {"repeat_equal": bool(torch.equal(first, second)),
            "locals": [[round(v, 6) for v in g.flatten().tolist()[:3]] for g in gathered],
            "states_equal": all(torch.equal(states[0], s) for s in states)}


@check
def autocast_bf16():
    a = torch.ones(4, 4, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        inside = [str(torch.mm(a, a).dtype), torch.is_autocast_enabled("cuda"), str(torch.get_autocast_dtype("cuda"))]
        with torch.autocast("cuda", enabled=False):
            disabled = str(torch.mm(a, a).dtype)
    with torch.cuda.amp.autocast(dtype=torch.bfloat16):
        legacy = str(nn.Linear(4, 4).cuda()(a).dtype)
    return {"inside": inside, "disabled": disabled, "legacy": legacy, "after": str(torch.mm(a, a).dtype)}


@check
def grad_scaler_steps():
    model = nn.Linear(4, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=8.0)
    before = model.weight.detach().clone()
    scaler.scale(model(torch.ones(2, 4, device="cuda")).sum()).backward()
    scaler.step(opt)
    scaler.update()
    return {"scale": scaler.get_scale(), "moved": bool(not torch.equal(before, model.weight))}


@check
def dtensor_attention_matches_plain():
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, device="cuda", requires_grad=True) for _ in range(3))
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    plain.sum().backward()
    tp = MESH["tp"]
    dq, dk, dv = (distribute_tensor(t.detach(), tp, [Shard(1)]).requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    out.sum().backward()
    return {"out": float((out.full_tensor() - plain).abs().max()),
            "grad_q": float((dq.grad.full_tensor() - q.grad).abs().max())}


@check
def nccl_contract():
    rank, world = dist.get_rank(), dist.get_world_size()
    zero_d = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(zero_d, torch.tensor(float(rank)))
    reshaped = [torch.zeros(4) for _ in range(world)]
    dist.all_gather(reshaped, torch.full((2, 2), float(rank)))
    uneven = [torch.zeros(r + 1) for r in range(world)]
    dist.all_gather(uneven, torch.full((rank + 1,), float(rank)))
    stacked = torch.zeros(world, 2)
    dist.all_gather_into_tensor(stacked, torch.full((2,), float(rank)))
    scattered = torch.zeros(2)
    dist.reduce_scatter_tensor(scattered, torch.ones(world, 2))
    premul = torch.ones(2)
    dist.all_reduce(premul, op=dist._make_nccl_premul_sum(0.5))
    gloo = dist.new_group(backend="gloo")
    return {
        "untagged": _p2p_tags(rank, gloo),
        "zero_d": [t.tolist() for t in zero_d], "reshaped": [t.tolist() for t in reshaped],
        "uneven": [t.tolist() for t in uneven], "stacked": stacked.tolist(), "scattered": scattered.tolist(),
        "premul": premul.tolist(),
        "non_contiguous": raises(lambda: dist.all_reduce(torch.ones(2, 2).t()[0])),
        "gloo_group_keeps_gloo": raises(lambda: dist.all_gather([torch.zeros(1) for _ in range(world)],
                                                                torch.tensor(1.0), group=gloo)),
    }


def _p2p_tags(rank, gloo):
    """A send and a recv whose tags disagree pair on NCCL, which ignores tags; gloo pairs by tag."""
    peer, value = rank ^ 1, float(rank + 1)
    if rank % 2 == 0:
        dist.send(torch.full((2,), value), dst=peer, tag=1)
        works = [dist.isend(torch.full((2,), value * k), dst=peer, tag=k, group=gloo) for k in (1, 2)]
        for work in works:
            work.wait()
        return None
    untagged, by_tag = torch.zeros(2), [torch.zeros(2), torch.zeros(2)]
    dist.recv(untagged, src=peer, tag=2)
    for k in (2, 1):
        dist.recv(by_tag[k - 1], src=peer, tag=k, group=gloo)
    return {"nccl": untagged.tolist(), "gloo": [t.tolist() for t in by_tag]}


@check
def unsimulated_apis_raise():
    return {name: raises(fn) for name, fn in {
        "torch.cuda.nccl.all_reduce": lambda: torch.cuda.nccl.all_reduce([torch.ones(1, device="cuda")]),
        "torch.cuda.memory._record_memory_history": lambda: torch.cuda.memory._record_memory_history(),
        "torch.cuda.memory._snapshot": lambda: torch.cuda.memory._snapshot(),
        "torch.cuda.caching_allocator_alloc": lambda: torch.cuda.caching_allocator_alloc(16),
        "torch.cuda.CUDAGraph": lambda: torch.cuda.CUDAGraph(),
        "torch.cuda.graph": lambda: torch.cuda.graph(None),
        "torch.cuda.list_gpu_processes": lambda: torch.cuda.list_gpu_processes(),
    }.items()}


@check
def fsdp1_trains_as_a_local_model():
    """FSDP1 as users write it (module.cuda(), device_id; HYBRID_SHARD on the mesh): every rank feeds the same
    batches, so after two steps its parameters equal those of a local copy trained alike."""
    import copy

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    differences = {}
    for name, kwargs in (("full_shard", {"device_id": torch.cuda.current_device()}),
                         ("hybrid_shard", {"device_mesh": MESH, "sharding_strategy": ShardingStrategy.HYBRID_SHARD})):
        torch.manual_seed(0)
        local = nn.Linear(4, 3)
        wrapped = FSDP(copy.deepcopy(local).cuda(), use_orig_params=True, **kwargs)
        for model, device in ((local, "cpu"), (wrapped, "cuda")):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(2):
                optimizer.zero_grad()
                model((torch.arange(8.0).reshape(2, 4) + step).to(device)).square().sum().backward()
                optimizer.step()
        with FSDP.summon_full_params(wrapped):
            differences[name] = max((a - b).abs().max().item()
                                    for a, b in zip(local.parameters(), wrapped.parameters()))
    return differences


@check
def dataloader_workers():
    """A DataLoader with worker processes (a rank may start children, as torchrun's ranks may), started as a new
    process starts them."""
    import multiprocessing

    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, num_workers=2, pin_memory=True)
    return [sum(batch[0].sum().item() for batch in loader), multiprocessing.get_start_method()]


@check
def streams_and_events():
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = torch.ones(2, device="cuda") * 2
    event = stream.record_event()
    torch.cuda.current_stream().wait_stream(stream)
    y.record_stream(stream)
    return [stream.is_capturing(), event.query(), torch.cuda.is_current_stream_capturing(), y.tolist()]


@check
def streams_are_distinct_and_events_timed():
    """A new stream is not the default one and is current inside its context; events recorded around work time it
    (host clock, the work having run when it returns), with CUDA's errors for events that cannot be timed;
    torch.Stream / torch.Event for "cuda" are the simulated ones."""
    default, side = torch.cuda.current_stream(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        inside = torch.cuda.current_stream() == side
    start, end, untimed = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
                           torch.cuda.Event())
    start.record()
    torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")
    end.record()
    end.synchronize()
    untimed.record()
    generic = torch.Event(device="cuda", enable_timing=True)
    generic.record()
    return {"streams": [side != default, inside, torch.cuda.current_stream() == default,
                        torch.cuda.default_stream() == default, isinstance(torch.Stream(device="cuda"), torch.Stream)],
            "elapsed": [start.elapsed_time(end) >= 0, start.elapsed_time(end) == start.elapsed_time(end),
                        isinstance(generic.elapsed_time(generic), float)],
            "untimed": raises(lambda: start.elapsed_time(untimed)),
            "unrecorded": raises(lambda: torch.cuda.Event(enable_timing=True).elapsed_time(end))}


@check
def card_facts_and_nccl_version():
    properties = torch.cuda.get_device_properties(LOCAL_RANK)
    with torch.cuda.device_of(torch.ones(1, device=f"cuda:{1 - LOCAL_RANK}")):
        of = torch.cuda.current_device()
    return {"name": torch.cuda.get_device_name(), "l2": properties.L2_cache_size, "device_of": of,
            "nccl": [list(torch.cuda.nccl.version()), torch._C._nccl_version(),
                     torch.cuda.nccl.is_available([torch.ones(2, device="cuda")])],
            "allocator_settings": torch.cuda.memory._set_allocator_settings("expandable_segments:True")}


@check
def forced_cuda_attention_kernels_and_cleanup():
    """sdpa_kernel(EFFICIENT_ATTENTION / CUDNN_ATTENTION) runs CUDA's kernel (computed with the CPU's), forward and
    backward, boolean mask as CUDA makes it a bias; torch.accelerator.empty_cache() and torch.cuda.ipc_collect()."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 16, 8, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mask = torch.ones(16, 16, dtype=torch.bool, device="cuda").tril()
    with sdpa_kernel(SDPBackend.MATH):
        reference = F.scaled_dot_product_attention(q, q, q, attn_mask=mask).float()
    differences = {}
    for backend in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        out.sum().backward()
        differences[backend.name] = [(out.float() - reference).abs().max().item() < 0.05, q.grad is not None]
    torch.accelerator.empty_cache()
    torch.cuda.ipc_collect()
    return differences


report(600)
