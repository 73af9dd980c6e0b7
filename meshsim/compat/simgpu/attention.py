"""CUDA's attention kernels on simulated GPUs, for context parallelism's ring attention.

Ring attention (torch.distributed.tensor.experimental's context parallelism) takes SDPA's CUDA operators only:
flash, memory-efficient and cuDNN attention, forward and backward. It runs them on each rank's blocks of the
sequence and merges the blocks' outputs by their logsumexps. A simulated GPU's tensors are CPU tensors: SDPA
picks the CPU's flash kernel for them, and the CUDA operators have no CPU kernel. So here:
- each of the six CUDA operators gets a CPU kernel that computes with the CPU's flash kernel
  (_scaled_dot_product_flash_attention_for_cpu and its backward: an exact softmax and logsumexp) and returns what
  the CUDA operator returns, as torch's meta kernels state it: the dtypes CUDA's kernel takes (others fail as on
  a GPU), the logsumexp in float32 laid out as that operator lays it out ((B, H, L) for flash, (B, H, L) padded
  to a multiple of 32 for memory-efficient, (B, H, L, 1) for cuDNN), Philox seed and offset tensors;
- SDPA on DTensors of a simulated GPU mesh, while the context parallel dispatcher is on, picks among those
  operators as CUDA's SDPA does (the enabled backends in their priority order, by dtype), so that DTensor hands
  the call to ring attention as on a GPU, and autograd records the CUDA operator's backward.
Dropout draws its mask from CUDA's Philox generator, which the CPU does not reproduce: dropout_p > 0 refuses.
"""

from __future__ import annotations

from typing import Any

from ..patching import patch
from .state import refusal

_LIBRARIES: list = []  # the torch.library registrations live as long as the rank
_DTENSOR: list = [()]  # DTensor's class once installed (an empty tuple: nothing is an instance of it)

DROPOUT_WHY = ("dropout in CUDA's attention kernels draws its mask from CUDA's Philox generator, which meshsim "
               "does not reproduce on the CPU; run with dropout_p=0")
MATH_WHY = ("ring attention takes CUDA's flash, memory-efficient and cuDNN attention only; "
            "for {dtype} with the SDPA backends enabled here CUDA would pick its math kernel, which ring attention "
            "does not take: enable a backend that takes {dtype} (flash and cuDNN: float16, bfloat16; "
            "memory-efficient: those and float32)")

FLASH, EFFICIENT, CUDNN = "flash", "efficient", "cudnn"
# The dtypes each CUDA kernel takes (an H100's: flash-attention 2, cutlass's memory-efficient kernel, cuDNN).
TAKES = {FLASH: ("float16", "bfloat16"), EFFICIENT: ("float16", "bfloat16", "float32"),
         CUDNN: ("float16", "bfloat16")}
OPERATORS = {FLASH: "_scaled_dot_product_flash_attention", EFFICIENT: "_scaled_dot_product_efficient_attention",
             CUDNN: "_scaled_dot_product_cudnn_attention"}


def _check(query: Any, backend: str, dropout_p: float) -> None:
    api = f"aten.{OPERATORS[backend]}"
    dtype = str(query.dtype).removeprefix("torch.")
    if dtype not in TAKES[backend]:
        raise RuntimeError(f"{api}: CUDA's kernel takes {', '.join(TAKES[backend])}, not {dtype}")
    if dropout_p > 0:
        raise refusal(api, DROPOUT_WHY)


def _forward(query: Any, key: Any, value: Any, mask: Any, is_causal: bool, scale: Any) -> tuple[Any, Any]:
    """The output and its float32 (B, H, L) logsumexp, contiguous as CUDA's."""
    import torch

    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=mask, scale=scale)
    return out, lse.to(torch.float32).contiguous()


def _backward(grad: Any, query: Any, key: Any, value: Any, out: Any, lse: Any, mask: Any, is_causal: bool,
              scale: Any) -> tuple[Any, Any, Any]:
    import torch

    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, query, key, value, out, lse, 0.0, is_causal, attn_mask=mask, scale=scale)


def _seeds(dtype: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """Philox seed and offset as the CUDA operator returns them; no dropout drew from them."""
    import torch

    return torch.zeros(shape, dtype=dtype), torch.zeros((), dtype=dtype)


def flash(query: Any, key: Any, value: Any, dropout_p: float = 0.0, is_causal: bool = False,
          return_debug_mask: bool = False, *, scale: Any = None) -> tuple:
    import torch

    _check(query, FLASH, dropout_p)
    if return_debug_mask:
        raise refusal("aten._scaled_dot_product_flash_attention(return_debug_mask=True)",
                      "its debug mask is the flash kernel's own tiling of the attention weights")
    out, lse = _forward(query, key, value, None, is_causal, scale)
    seed, offset = _seeds(torch.uint64, (2,))
    return (out, lse, None, None, query.size(2), key.size(2), seed, offset, query.new_empty(0))


def flash_backward(grad_out: Any, query: Any, key: Any, value: Any, out: Any, logsumexp: Any, cum_seq_q: Any,
                   cum_seq_k: Any, max_q: int, max_k: int, dropout_p: float, is_causal: bool, philox_seed: Any,
                   philox_offset: Any, *, scale: Any = None) -> tuple:
    _check(query, FLASH, dropout_p)
    return _backward(grad_out, query, key, value, out, logsumexp, None, is_causal, scale)


def efficient(query: Any, key: Any, value: Any, attn_bias: Any, compute_log_sumexp: bool, dropout_p: float = 0.0,
              is_causal: bool = False, *, scale: Any = None) -> tuple:
    import torch

    _check(query, EFFICIENT, dropout_p)
    out, lse = _forward(query, key, value, attn_bias, is_causal, scale)
    length = query.size(2)
    # cutlass's kernel aligns the logsumexp's rows to 32; rows past the sequence hold what a row with no keys holds
    padded = -(-length // 32) * 32 if compute_log_sumexp else 0
    full = torch.full((*lse.shape[:2], padded), float("inf"), dtype=torch.float32)
    full[..., :min(length, padded)] = lse[..., :padded]
    seed, offset = _seeds(torch.int64, ())
    return out, full, seed, offset


def efficient_backward(grad_out_: Any, query: Any, key: Any, value: Any, attn_bias: Any, out: Any, logsumexp: Any,
                       philox_seed: Any, philox_offset: Any, dropout_p: float, grad_input_mask: Any,
                       is_causal: bool = False, *, scale: Any = None) -> tuple:
    _check(query, EFFICIENT, dropout_p)
    if attn_bias is not None and grad_input_mask[3]:
        raise refusal("aten._scaled_dot_product_efficient_attention_backward for the gradient of attn_bias",
                      "a simulated GPU's attention backward gives the gradients of query, key and value only")
    lse = logsumexp[..., :query.size(2)].contiguous()
    return (*_backward(grad_out_, query, key, value, out, lse, attn_bias, is_causal, scale), None)


def cudnn(query: Any, key: Any, value: Any, attn_bias: Any, compute_log_sumexp: bool, dropout_p: float = 0.0,
          is_causal: bool = False, return_debug_mask: bool = False, *, scale: Any = None) -> tuple:
    import torch

    _check(query, CUDNN, dropout_p)
    out, lse = _forward(query, key, value, attn_bias, is_causal, scale)
    seed, offset = _seeds(torch.int64, ())
    return (out, lse.unsqueeze(-1), None, None, query.size(2), key.size(2), seed, offset, None)


def cudnn_backward(grad_out: Any, query: Any, key: Any, value: Any, out: Any, logsumexp: Any, philox_seed: Any,
                   philox_offset: Any, attn_bias: Any, cum_seq_q: Any, cum_seq_k: Any, max_q: int, max_k: int,
                   dropout_p: float, is_causal: bool, *, scale: Any = None) -> tuple:
    _check(query, CUDNN, dropout_p)
    lse = logsumexp.squeeze(-1).contiguous()
    return _backward(grad_out, query, key, value, out, lse, attn_bias, is_causal, scale)


KERNELS = {OPERATORS[FLASH]: flash, f"{OPERATORS[FLASH]}_backward": flash_backward,
           OPERATORS[EFFICIENT]: efficient, f"{OPERATORS[EFFICIENT]}_backward": efficient_backward,
           OPERATORS[CUDNN]: cudnn, f"{OPERATORS[CUDNN]}_backward": cudnn_backward}


def _register_kernels() -> None:
    """The CUDA operators' kernels for the CPU key, where a simulated GPU's tensors dispatch. A CPU-only torch has
    none for them (they are CUDA's alone), so nothing of the CPU's own changes."""
    import torch

    library = torch.library.Library("aten", "IMPL")
    _LIBRARIES.append(library)
    for name, kernel in KERNELS.items():
        if not hasattr(torch.ops.aten, name):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CPU"):
            continue  # a torch with a CPU kernel of its own keeps it
        library.impl(name, kernel, "CPU")


def cuda_backend(query: Any, attn_mask: Any) -> str | None:
    """The CUDA operator CUDA's SDPA would call for `query`: the first enabled backend, in the priority order
    (torch.nn.attention.sdpa_kernel's), that takes its dtype; None where that is the math kernel or none is."""
    import torch

    enabled = {1: (FLASH, torch.backends.cuda.flash_sdp_enabled()),
               2: (EFFICIENT, torch.backends.cuda.mem_efficient_sdp_enabled()),
               3: (CUDNN, torch.backends.cuda.cudnn_sdp_enabled()),
               0: (None, torch.backends.cuda.math_sdp_enabled())}
    order = getattr(torch._C, "_get_sdp_priority_order", lambda: [1, 2, 0, 3])()
    dtype = str(query.dtype).removeprefix("torch.")
    for number in order:
        backend, on = enabled.get(number, (None, False))
        if not on:
            continue
        if backend is None:
            return None  # the math kernel
        if dtype in TAKES[backend] and not (backend == FLASH and attn_mask is not None):
            return backend
    return None


def _ring_attention_takes(query: Any) -> bool:
    """Whether DTensor hands SDPA's CUDA operators to ring attention for `query`: a DTensor on a simulated GPU
    mesh, with the context parallel dispatcher on."""
    dtensor = _DTENSOR[0]
    if not isinstance(query, dtensor) or query.device_mesh.device_type != "cuda":
        return False
    import torch

    return torch.ops.aten._scaled_dot_product_flash_attention.default in dtensor._op_dispatcher._custom_op_handlers


def _sdpa(original: Any, *args: Any, **kwargs: Any) -> Any:
    """SDPA as CUDA's picks its operator, for ring attention and for simulated GPU tensors whose only enabled
    backends are CUDA's memory-efficient or cuDNN kernels (sdpa_kernel(EFFICIENT_ATTENTION)), which the CPU lacks;
    every other call is torch's own, untouched."""
    query = args[0] if args else kwargs.get("query")
    if _ring_attention_takes(query):
        return _cuda_sdpa(*args, **kwargs)
    if _only_cuda_kernels(query):
        return _cuda_sdpa(*_bias_from_bool_mask(args, kwargs), **{k: v for k, v in kwargs.items() if k != "attn_mask"})
    return original(*args, **kwargs)


def _only_cuda_kernels(query: Any) -> bool:
    import torch

    from . import memory

    cuda = torch.backends.cuda
    return not (cuda.flash_sdp_enabled() or cuda.math_sdp_enabled()) and memory.device_of(query) is not None and \
        cuda_backend(query, None) in (EFFICIENT, CUDNN)


def _bias_from_bool_mask(args: tuple, kwargs: dict) -> tuple:
    """(query, key, value, attn_mask) with a boolean mask as the additive bias CUDA's SDPA makes of it."""
    import torch

    query, key, value = (args + tuple(kwargs.get(n) for n in ("query", "key", "value")[len(args):]))[:3]
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros_like(mask, dtype=query.dtype).masked_fill_(~mask, float("-inf"))
    return (query, key, value, mask, *args[4:])


def _cuda_sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
               is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
    import torch

    aten = torch.ops.aten
    backend = cuda_backend(query, attn_mask)
    if backend is None:
        dtype = str(query.dtype).removeprefix("torch.")
        raise refusal("scaled_dot_product_attention under context parallelism", MATH_WHY.format(dtype=dtype))
    if key.size(-3) != query.size(-3) and not enable_gqa:
        raise RuntimeError(f"scaled_dot_product_attention: query has {query.size(-3)} heads, key and value "
                           f"{key.size(-3)}: grouped-query attention needs enable_gqa=True")
    # grouped-query attention's fewer key and value heads go to the operator as they are: CUDA's flash and cuDNN
    # kernels take them so, as does the CPU kernel that computes them here
    # CUDA's SDPA asks for the logsumexp only where a backward will need it (ring attention asks for it always)
    wants_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if backend == FLASH:
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, scale=scale)[0]
    if backend == EFFICIENT:
        return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, wants_lse, dropout_p,
                                                            is_causal, scale=scale)[0]
    return aten._scaled_dot_product_cudnn_attention(query, key, value, attn_mask, wants_lse, dropout_p, is_causal,
                                                    False, scale=scale)[0]


@patch("simgpu.attention", "context parallelism's ring attention on simulated GPUs (CUDA's attention kernels)",
       targets=("torch.nn.functional.scaled_dot_product_attention",))
def install() -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor

    from ..patching import wrap

    _DTENSOR[0] = DTensor
    _register_kernels()
    if not getattr(F.scaled_dot_product_attention, "meshsim", False):
        wrap(F, "scaled_dot_product_attention", _sdpa)
        F.scaled_dot_product_attention.meshsim = True  # type: ignore[attr-defined]
    _flex_attention_eager_only()


def _flex_attention_eager_only() -> None:
    """Flex attention called outside torch.compile still compiles its higher-order operator (fullgraph, a backend
    that only traces), and dynamo refuses to trace beside a non-infra dispatch mode (the simulated GPUs' memory
    accounting) with a page of skipped frames. torch's own switch for that step calls the operator directly: the
    same dense implementation the traced one runs."""
    try:
        import torch.nn.attention.flex_attention as flex
    except ImportError:  # a release without it
        return
    if hasattr(flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"):
        flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    if hasattr(flex, "_validate_device") and not getattr(flex._validate_device, "meshsim", False):
        from ..patching import wrap

        wrap(flex, "_validate_device", _flex_device_as_cuda)
        flex._validate_device.meshsim = True  # type: ignore[attr-defined]


def _flex_device_as_cuda(original: Any, query: Any, key: Any, value: Any) -> None:
    """torch refuses flex attention's backward for CPU tensors because its CPU kernel (inductor's C++ template) has
    none. On CUDA, flex attention run eagerly differentiates through torch's dense implementation, which is plain
    tensor math that runs on the CPU as well: so a query on a simulated GPU is checked as CUDA's (no refusal), and
    a query in host memory keeps torch's CPU check."""
    from .memory import device_of

    if device_of(query) is None:
        original(query, key, value)
