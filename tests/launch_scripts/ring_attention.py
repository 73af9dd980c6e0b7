"""Context parallelism's ring attention on simulated GPUs against plain attention over the whole sequence (run by
tests/test_simgpu_attention.py on one host of 4 GPUs, a 1-D mesh of 4).

Every rank computes plain SDPA over the whole sequence itself, from the same seed, and compares it with the ring
attention output and gradients, gathered back into sequence order. Each check returns the largest differences;
relative to the largest magnitude; the rank prints one line `RESULTS <json>` and the tests read it back.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from checklist import check, raises, report
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import (
    _context_parallel_shard,
    _ContextParallel,
    _cp_options,
    _enable_context_parallel_dispatcher,
    _HeadTailLoadBalancer,
    context_parallel_unshard,
    set_rotate_method,
)
from torch.distributed.tensor.parallel import parallelize_module
from torch.nn.attention import SDPBackend, sdpa_kernel

aten = torch.ops.aten
dist.init_process_group("nccl")
MESH = init_device_mesh("cuda", (dist.get_world_size(),), mesh_dim_names=("cp",))
TITAN = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]  # torchtitan 0.2.2's list


def _qkv(dtype, length=256):
    torch.manual_seed(0)
    return [torch.randn(2, 4, length, 16, device="cuda", dtype=dtype) for _ in range(3)]


def _plain(q, k, v, is_causal):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=k.size(1) != q.size(1))
    out.backward(_grad_of(out))
    return [out.detach(), q.grad, k.grad, v.grad]


def _grad_of(out):
    torch.manual_seed(1)
    return torch.randn_like(out)


def _apart(ring, plain):
    """The largest difference of each tensor, relative to the largest magnitude of the plain one."""
    return [float((r.double() - p.double()).abs().max() / p.double().abs().max()) for r, p in zip(ring, plain)]


def _legacy(dtype, is_causal=True, backends=None, rotate="allgather"):
    """torch's context_parallel(): SDPA patched, buffers sharded in place (head-tail balanced when causal)."""
    q, k, v = _qkv(dtype)
    plain = _plain(q, k, v, is_causal)
    set_rotate_method(rotate)
    _cp_options.enable_load_balance = is_causal  # torch balances causal attention only
    q, k, v, grad = (t.clone() for t in (q, k, v, _grad_of(plain[0])))
    kernels = sdpa_kernel(backends, set_priority=True) if backends else contextlib.nullcontext()
    try:
        with kernels, context_parallel(MESH, buffers=[q, k, v, grad], buffer_seq_dims=[2] * 4):
            # (the buffers themselves are resized back on exit, which autograd's leaves may not be)
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
            out.backward(grad)
            ring = context_parallel_unshard(MESH, [out.detach(), q.grad, k.grad, v.grad], [2] * 4)
    finally:
        set_rotate_method("allgather")
        _cp_options.enable_load_balance = True
    return _apart(ring, plain)


class Attention(nn.Module):
    """torchtitan's ScaledDotProductAttentionWrapper: SDPA in a module, for _ContextParallel to wrap."""

    def forward(self, q, k, v):
        with sdpa_kernel(TITAN, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.size(1) != q.size(1))


def _module_wrapper(dtype, kv_heads=4):
    """torchtitan's way: _ContextParallel on the attention module, the dispatcher on, head-tail load balancing."""
    q, k, v = _qkv(dtype)
    k, v = k[:, :kv_heads].contiguous(), v[:, :kv_heads].contiguous()
    plain = _plain(q, k, v, True)
    attention = parallelize_module(Attention(), MESH, _ContextParallel(
        seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA))
    _enable_context_parallel_dispatcher()
    balancer = _HeadTailLoadBalancer(q.size(2), MESH.size(), MESH.device_type)
    q, k, v, grad = _context_parallel_shard(MESH, [q, k, v, _grad_of(plain[0])], [2] * 4, balancer)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attention(q, k, v)
    out.backward(grad)
    ring = context_parallel_unshard(MESH, [out.detach(), q.grad, k.grad, v.grad], [2] * 4, balancer)
    return _apart(ring, plain)


@check
def float32_causal_memory_efficient():
    return _legacy(torch.float32)


@check
def float32_causal_alltoall():
    return _legacy(torch.float32, rotate="alltoall")


@check
def float32_not_causal():
    return _legacy(torch.float32, is_causal=False)


@check
def bfloat16_causal_flash():
    return _legacy(torch.bfloat16, backends=[SDPBackend.FLASH_ATTENTION])


@check
def bfloat16_torchtitan_module_cudnn():
    return _module_wrapper(torch.bfloat16)


@check
def bfloat16_torchtitan_module_grouped_query():
    return _module_wrapper(torch.bfloat16, kv_heads=2)


@check
def float32_with_torchtitans_backends_refuses():
    return raises(lambda: _legacy(torch.float32, backends=TITAN))


@check
def dropout_refuses():
    q, k, v = _qkv(torch.float32)
    with context_parallel(MESH, buffers=[q, k, v], buffer_seq_dims=[2] * 3):
        return raises(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True))


def _math(q, k, v, is_causal):
    """Attention and its logsumexp by their definitions, in float64."""
    scores = (q.double() @ k.double().transpose(-1, -2)) / q.size(-1) ** 0.5
    if is_causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v.double(), scores.logsumexp(-1)


@check
def cuda_operators_give_the_cpu_math():
    """Each CUDA operator on a simulated GPU: its outputs' shapes and dtypes as torch's meta kernel states them,
    its output and logsumexp as the definitions give them, its gradients as autograd through the math gives."""
    found = {}
    for name, dtype, call in [
            ("flash", torch.bfloat16, lambda q, k, v: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)),
            ("efficient", torch.float32,
             lambda q, k, v: aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)),
            ("cudnn", torch.bfloat16,
             lambda q, k, v: aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True))]:
        q, k, v = (t.requires_grad_() for t in _qkv(dtype, length=40))
        outputs = call(q, k, v)
        meta = call(*(t.detach().to("meta") for t in (q, k, v)))
        shapes = [[list(o.shape), str(o.dtype)] if isinstance(o, torch.Tensor) else o for o in outputs]
        meta_shapes = [[list(o.shape), str(o.dtype)] if isinstance(o, torch.Tensor) else o for o in meta]
        out, lse = _math(q.detach(), k.detach(), v.detach(), True)
        outputs[0].backward(_grad_of(outputs[0]))
        reference = [t.detach().double().requires_grad_() for t in (q, k, v)]
        _math(*reference, True)[0].backward(_grad_of(outputs[0]).double())
        found[name] = {"shapes_as_meta": shapes == meta_shapes,
                       "out": _apart([outputs[0]], [out])[0],
                       "lse": _apart([outputs[1].squeeze(-1)[..., :40]], [lse])[0],
                       "grads": _apart([q.grad, k.grad, v.grad], [t.grad for t in reference])}
    found["float64_flash"] = raises(lambda: aten._scaled_dot_product_flash_attention(
        *_qkv(torch.float64, length=8)))
    return found


class Flex(nn.Module):
    """torchtitan's FlexAttention module: flex attention in a module, for _ContextParallel(FLEX) to wrap."""

    def forward(self, q, k, v):
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v)


@check
def flex_context_parallel_gives_full_flex_attention():
    """_ContextParallel(FLEX) all-gathers K and V and reduce-scatters their gradients: each rank's block of the
    output and gradients is full flex attention's (no mask: a block mask would need CP's own offsets)."""
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = (t.requires_grad_() for t in _qkv(torch.float32, length=64))
    full = flex_attention(q, k, v)
    full.backward(_grad_of(full))
    rank, size = MESH.get_local_rank(), MESH.size()
    attention = parallelize_module(Flex(), MESH, _ContextParallel(
        seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX))
    blocks = [t.detach().chunk(size, dim=2)[rank].contiguous().requires_grad_() for t in (q, k, v)]
    out = attention(*blocks)
    out.backward(_grad_of(full).chunk(size, dim=2)[rank].contiguous())
    reference = [t.chunk(size, dim=2)[rank] for t in (full.detach(), q.grad, k.grad, v.grad)]
    return _apart([out.detach()] + [t.grad for t in blocks], reference)


@check
def flex_attention_runs_eagerly_as_attention():
    """FlexAttention without CP, run eagerly (its dense implementation): the math of attention, its output counted
    on the GPU, and its backward (torch's dense one, as CUDA runs it eagerly) the gradients of that math; a query in
    host memory keeps torch's own one-line refusal of a CPU backward."""
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = _qkv(torch.float32, length=40)
    before = torch.cuda.memory_allocated()
    out = flex_attention(q, k, v)
    counted = torch.cuda.memory_allocated() - before >= out.numel() * out.element_size()
    grads = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    flex_attention(*grads).sum().backward()
    reference = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    _math(*reference, False)[0].sum().backward()
    host = raises(lambda: flex_attention(*(torch.randn(2, 4, 40, 16, device="cpu", requires_grad=True)
                                           for _ in range(3))).sum().backward())
    return {"apart": _apart([out], [_math(q, k, v, False)[0]])[0], "counted": counted,
            "grads": _apart([t.grad for t in grads], [t.grad for t in reference]), "host_backward": host}


report(900)
