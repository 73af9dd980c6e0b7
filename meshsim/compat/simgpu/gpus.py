"""Which GPU a simulated device is: its name, capability, multiprocessors and memory, as CUDA reports them.

Pure data (no torch): `meshsim launch --gpu NAME|BYTES`, `launch(..., gpu=...)` and `Cluster(..., gpu=...)` read
it before any rank starts, so a bad name is one line and exit 2. total_memory is what
`torch.cuda.get_device_properties().total_memory` says on that card (the board's memory less what the driver keeps),
which is also what the caching allocator may reserve before it raises CUDA's out-of-memory error.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import InputError

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class GPU:
    key: str  # the --gpu word ("h100-80gb")
    name: str  # torch.cuda.get_device_name()
    capability: tuple[int, int]
    multiprocessors: int
    total_memory: int  # bytes
    l2_cache: int  # bytes: get_device_properties().L2_cache_size

    def describe(self) -> str:
        return f"{self.name}, {self.total_memory / GiB:.2f} GiB"


# The names are the cards' own, as CUDA reports them: scripts look them up (peak-FLOPs tables) and match them.
CATALOGUE: dict[str, GPU] = {gpu.key: gpu for gpu in (
    GPU("h100-80gb", "NVIDIA H100 80GB HBM3", (9, 0), 132, 81559 * MiB, 50 * MiB),
    GPU("a100-40gb", "NVIDIA A100-SXM4-40GB", (8, 0), 108, 40339 * MiB, 40 * MiB),
    GPU("a100-80gb", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 81051 * MiB, 40 * MiB),
    GPU("h200-141gb", "NVIDIA H200", (9, 0), 132, 143771 * MiB, 50 * MiB),
)}
DEFAULT = "h100-80gb"


class GPUError(InputError):
    """A --gpu / gpu= that names no GPU meshsim knows and is not a number of bytes."""


def gpu_of(spec: str | int | GPU | None) -> GPU:
    """The simulated GPU that `spec` names: a catalogue word, a number of bytes (an H100 with that much memory,
    "80e9" and "85899345920" alike), a GPU, or None for the default H100 80GB."""
    if isinstance(spec, GPU):
        return spec
    if spec is None:
        return CATALOGUE[DEFAULT]
    text = str(spec).strip().lower()
    if text in CATALOGUE:
        return CATALOGUE[text]
    try:
        size = int(float(text)) if not isinstance(spec, int) else spec
    except ValueError:
        size = 0
    if isinstance(spec, bool) or size <= 0 or (not isinstance(spec, int) and not _is_number(text)):
        raise GPUError(f"--gpu {spec}: expected one of {', '.join(CATALOGUE)} or a number of bytes")
    base = CATALOGUE[DEFAULT]
    return GPU(f"{size}", "meshsim simulated GPU", base.capability, base.multiprocessors, size, base.l2_cache)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
