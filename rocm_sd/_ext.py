"""Loads rocm_sd._C, the kernel library, and says why it cannot be used when it cannot.

The reasons, checked in this order, are what `python -m rocm_sd info` prints and what each op's
`supports()` returns first:
  not built     the package was installed without a GPU toolchain (ROCM_SD_GPU=none or CPU torch)
  load failed   the library exists but did not load (missing HIP/CUDA runtime library, ...)
  platform      built for HIP but torch is a CUDA build, or the reverse
  no GPU        torch sees no GPU
  arch          the GPU's architecture is not among the targets _C was built for
"""
from __future__ import annotations

import functools
import importlib
import importlib.util

import torch

from . import platform

_C = None
LOAD_ERROR: str | None = None

if importlib.util.find_spec(f"{__package__}._C") is None:
    LOAD_ERROR = (
        "not built: rocm_sd was installed without kernels (ROCM_SD_GPU=none, or a CPU-only torch at install time); "
        "reinstall with a ROCm or CUDA torch present"
    )
else:
    try:
        _C = importlib.import_module(f"{__package__}._C")
    except ImportError as error:  # e.g. libamdhip64.so or the CUDA driver library not found
        LOAD_ERROR = f"load failed: {error}"


def build_info() -> dict | None:
    return dict(_C.build_info()) if _C is not None else None


@functools.lru_cache(maxsize=None)
def _device_reason(index: int) -> str | None:
    built_for = _C.build_info()["platform"]
    running = platform.torch_gpu_platform()
    if running == "none":
        return "no GPU: torch is a CPU-only build"
    if built_for != running:
        return f"platform: _C was built for {built_for} but torch is a {running} build; reinstall rocm_sd"
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return "no GPU: torch sees no GPU"
    why = _C.check_kernel_image(index)
    if why:
        targets = _C.build_info()["targets"]
        return f"arch: {platform.device_arch(index)} is not among the built targets ({targets}): {why}"
    return None


def unavailable_reason(device: torch.device) -> str | None:
    """None if kernels can run on `device`, else why not."""
    if _C is None:
        return LOAD_ERROR
    if device.type != "cuda":  # torch calls ROCm devices "cuda" too
        return f"device: tensors are on {device.type}, kernels run on the GPU"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _device_reason(index)
