"""torch's parallelism libraries on simulated GPU meshes: FSDP2's and FSDP1's device, and DTensor's attention.

FSDP2 computes its device from the mesh (cuda:current) and asserts that every parameter is already on it; the
simulated GPUs' tensors report cpu, so FSDP2 is told the device its tensors are on. It then runs the path it runs
for the same script with its device edited to "cpu": the same collectives and arithmetic, with synchronous
streams, which is what the simulated GPUs' streams are anyway.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..patching import patch

# (module, name) of the functions by which FSDP2 (and replicate, built on it) and FSDP1 pick their device. FSDP1
# takes it from its parameters or from cuda:current, and checks before every forward that its flat parameters are
# on it; told the cpu, it runs its CPU path, as for the same script with its device edited to "cpu".
FSDP_DEVICE = (("torch.distributed.fsdp._fully_shard._fsdp_init", "_get_device_from_mesh"),
               ("torch.distributed.fsdp._fully_shard._fully_shard", "_get_device_from_mesh"),
               ("torch.distributed._composable.replicate_with_fsdp", "_get_device_from_mesh"),
               ("torch.distributed.fsdp._init_utils", "_get_compute_device"))


def _fsdp_device() -> None:
    import torch

    cpu = torch.device("cpu")

    def device_of_simulated_gpus(*args: Any, **kwargs: Any) -> Any:
        return cpu  # where a simulated GPU mesh's tensors are

    for module_name, name in FSDP_DEVICE:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, name):
            setattr(module, name, device_of_simulated_gpus)


def _attention_strategies() -> None:
    """DTensor's scaled_dot_product_attention on a simulated GPU mesh. On the CPU, torch picks its CPU flash
    kernel, for which DTensor has no sharding rule (the scripts fail); on GPUs it picks flash or memory-efficient
    attention, which DTensor shards by batch or by heads. The CPU kernel gets those same rules: replicated,
    sharded on heads (tensor parallelism) or on the batch, for the forward and the backward."""
    import torch
    from torch.distributed.tensor import Replicate, Shard

    try:
        from torch.distributed.tensor._op_schema import OpStrategy, RuntimeSchemaInfo
        from torch.distributed.tensor._ops import utils
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    except ImportError:  # another torch layout: its own rules stand
        return
    register_op_strategy: Any = getattr(utils, "register_op_strategy", None)
    if register_op_strategy is None:  # torch 2.10 keeps it in a module of its own
        registration: Any = importlib.import_module("torch.distributed.tensor._ops.registration")
        register_op_strategy = registration.register_op_strategy
    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is None or backward is None:
        return

    def rules(op_schema: Any, outputs: int) -> list:
        tensors = sum(isinstance(arg, OpStrategy) for arg in op_schema.args_schema)
        return [[placement] * (outputs + tensors) for placement in (Replicate(), Shard(1), Shard(0))]

    def forward_strategy(op_schema: Any) -> Any:
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, rules(op_schema, 2),
                                               input_index=2)

    def backward_strategy(op_schema: Any) -> Any:
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(validate=False), op_schema,
                                               rules(op_schema, 3), input_index=3)

    static = RuntimeSchemaInfo(3, static_kwargkey=["scale"])
    register_op_strategy(forward.default, schema_info=static)(forward_strategy)
    register_op_strategy(backward.default, schema_info=RuntimeSchemaInfo(6, static_kwargkey=["scale"]))(
        backward_strategy)


def _sharding_propagation_on_cpu() -> None:
    """DTensor propagates shapes by running an operator on fake tensors of the mesh's device type; a fake CUDA
    tensor cannot run random operators' decompositions on a CPU-only torch (no CUDA device guard). Shapes,
    strides and dtypes do not depend on the device, so the fake tensors of a simulated GPU mesh are CPU ones."""
    import torch

    try:
        from torch.distributed.tensor import _op_schema
    except ImportError:
        return
    original = getattr(_op_schema, "_rebuild_tensor_from_dtensor_meta", None)
    if original is None:
        return

    def rebuild(arg: Any) -> Any:
        if arg.mesh.device_type != "cuda" or arg.tensor_meta is None:
            return original(arg)
        meta = arg.tensor_meta
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="cpu")

    _op_schema._rebuild_tensor_from_dtensor_meta = rebuild


def _capturable_optimizers() -> None:
    """Optimizers' capturable=True keeps their step counts on the device and never syncs to the host, for CUDA
    graphs; torch accepts it only for devices it lists, and the simulated GPUs' tensors are CPU tensors. The
    arithmetic is the same on the CPU, so the CPU joins each optimizer's list."""
    import pkgutil

    import torch.optim

    for info in pkgutil.iter_modules(torch.optim.__path__):
        module = importlib.import_module(f"torch.optim.{info.name}")
        original = getattr(module, "_get_capturable_supported_devices", None)
        if original is None or getattr(original, "meshsim", False):
            continue

        def supported(*args: Any, original: Any = original, **kwargs: Any) -> list[str]:
            return [*original(*args, **kwargs), "cpu"]

        supported.meshsim = True  # type: ignore[attr-defined]
        setattr(module, "_get_capturable_supported_devices", supported)  # noqa: B010


@patch("simgpu.parallel", "FSDP's device, DTensor's attention and shape propagation on simulated GPU meshes",
       targets=tuple(f"{module}.{name}" for module, name in FSDP_DEVICE) + (
           "torch.distributed.tensor._op_schema._rebuild_tensor_from_dtensor_meta",),
       optional=tuple(f"{module}.{name}" for module, name in FSDP_DEVICE) + (
           "torch.distributed.tensor._op_schema._rebuild_tensor_from_dtensor_meta",))
def install() -> None:
    _fsdp_device()
    _capturable_optimizers()
    _attention_strategies()
    _sharding_propagation_on_cpu()
