"""Mixed precision on simulated GPUs: autocast("cuda") is real autocasting, on the CPU where the data is.

torch's autocast for "cuda" acts only on CUDA tensors, so on the simulated GPUs (CPU tensors) it would silently
compute in fp32. Entering autocast("cuda", dtype, enabled, cache_enabled) here also enters CPU autocast with
the same settings: matmuls and linear layers run in bf16 (or fp16) as on a GPU, while torch.is_autocast_enabled
("cuda") and get_autocast_dtype("cuda") answer as on a GPU. (CPU autocast casts by its own op lists, which match
CUDA's for the matmul-like ops that dominate a model; a few ops differ in which precision they keep.)
GradScaler("cuda") scales, unscales and skips steps with torch's CPU kernels for the same operations.
"""

from __future__ import annotations

from typing import Any

from ..patching import patch


@patch("simgpu.amp", "autocast(\"cuda\") as real mixed precision on the CPU",
       targets=("torch.amp.autocast_mode.autocast.__enter__", "torch.amp.autocast_mode.autocast.__exit__",
                "torch.cuda.amp.common.amp_definitely_not_available"))
def install() -> None:
    import torch
    from torch.amp.autocast_mode import autocast

    original_enter, original_exit = autocast.__enter__, autocast.__exit__

    def enter(self: Any) -> Any:
        result = original_enter(self)
        if self.device == "cuda":
            companion = autocast("cpu", dtype=self.fast_dtype, enabled=self._enabled,
                                 cache_enabled=self._cache_enabled)
            companion.__enter__()
            self.__dict__.setdefault("_meshsim_cpu", []).append(companion)
        return result

    def exit(self: Any, *exc: Any) -> Any:
        companions = self.__dict__.get("_meshsim_cpu")
        if companions:
            companions.pop().__exit__(*exc)
        return original_exit(self, *exc)

    setattr(autocast, "__enter__", enter)  # noqa: B010 -- mypy refuses assigning a method
    setattr(autocast, "__exit__", exit)  # noqa: B010
    common: Any = torch.cuda.amp.common
    common.amp_definitely_not_available = lambda: False
