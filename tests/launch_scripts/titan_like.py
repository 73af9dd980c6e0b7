"""A small torchtitan-like training job, as a GPU script writes it: a Llama-style model (RMSNorm, rotary-free
attention through scaled_dot_product_attention, SwiGLU), built on the meta device and materialized with
to_empty(device="cuda"), tensor parallelism over "tp" and FSDP2 over "dp" of a (dp, tp) mesh, bf16 parameters in
FSDP's mixed precision, AdamW, the gradients' norm, and torchtitan's memory monitor (reset_peak_memory_stats,
memory_stats()'s active and reserved peaks, num_alloc_retries, num_ooms).

Step 2 runs under torch's own estimator, FSDPMemTracker, so its peak sits next to the simulated GPU's. The rank
prints `RESULT <json>`: losses, grad norms, and the memory figures (tests/test_titan_like.py reads it).
    python -m meshsim launch --nnodes 2 --nproc-per-node 2 titan_like.py [TP]
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

DIM, HEADS, LAYERS, VOCAB, SEQ, BATCH = 128, 4, 2, 512, 64, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(DIM, 4 * DIM, bias=False), nn.Linear(DIM, 4 * DIM, bias=False)
        self.w2 = nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x):
        h = self.attention_norm(x)
        batch, seq, _ = h.shape
        q, k, v = (w(h).view(batch, seq, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(attended.transpose(1, 2).reshape(batch, seq, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def build(mesh, tp):
    with torch.device("meta"):
        model = Model()
    if tp > 1:
        plan = {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(), "wo": RowwiseParallel(),
                "w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
        for layer in model.layers:
            parallelize_module(layer, mesh["tp"], plan)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["dp"], mp_policy=policy)
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy)
    model.to_empty(device="cuda")
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.02) if parameter.dim() > 1 else parameter.fill_(1.0)
    return model


def main():
    tp = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cuda", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.empty_cache()
    model = build(mesh, tp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    generator = torch.Generator().manual_seed(1234 + mesh["dp"].get_local_rank())
    losses, norms, figures = [], [], {}
    for step in range(1, 4):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator).cuda()
        tracker = FSDPMemTracker(model, optimizer) if step == 2 else None
        if tracker is not None:
            tracker.track_inputs((tokens,))
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            tracker.__enter__()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        norms.append(torch.stack([p.grad.full_tensor().float().norm() for p in model.parameters()]).norm().item())
        optimizer.step()
        optimizer.zero_grad()
        if tracker is not None:
            tracker.__exit__(None, None, None)
            stats = torch.cuda.memory_stats()
            estimate = sum(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())
            figures = {"meshsim_peak": stats["active_bytes.all.peak"], "meshsim_before": before,
                       "fsdp_mem_tracker_peak": estimate, "reserved_peak": stats["reserved_bytes.all.peak"],
                       "retries": stats["num_alloc_retries"], "ooms": stats["num_ooms"]}
        losses.append(loss.item())
    parameters = sum(p.to_local().numel() * p.to_local().element_size() for p in model.parameters())
    figures.update(local_parameter_bytes=parameters, after=torch.cuda.memory_allocated())
    print("RESULT " + json.dumps({"losses": losses, "grad_norms": norms, "memory": figures}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    dist.init_process_group("nccl")
    main()
