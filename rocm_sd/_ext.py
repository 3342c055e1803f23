"""Loads rocm_sd._C, the kernel library, chooses where kernels come from, and says why they cannot run when they
cannot.

`_C` is what the ops call: the built library, or the runtime-compiled backend (rocm_sd/jit/), which has the same
functions for the ops it covers. ROCM_SD_KERNELS picks (config.py): `auto` takes the built library on a GPU it has
code for and compiles the shipped sources at first use on any other (no _C, or _C without the GPU's arch);
`built` never compiles; `jit` always does. The choice is made once per process, at the first GPU query.

The reasons of the built library, checked in this order, are what `python -m rocm_sd info` prints and what each
op's `supports()` returns first (followed by why runtime compilation is not possible either, where it was tried):
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

from . import config, platform

_C = None  # what the ops call: BUILT or the JIT backend (set by _device_reason)
BUILT = None  # the built library
LOAD_ERROR: str | None = None
_jit = None

if importlib.util.find_spec(f"{__package__}._C") is None:
    LOAD_ERROR = (
        "not built: rocm_sd was installed without kernels (ROCM_SD_GPU=none, or a CPU-only torch at install time); "
        "reinstall with a ROCm or CUDA torch present"
    )
else:
    try:
        BUILT = _C = importlib.import_module(f"{__package__}._C")
    except ImportError as error:  # e.g. libamdhip64.so or the CUDA driver library not found
        LOAD_ERROR = f"load failed: {error}"


def jit_backend():
    """The runtime-compiled backend (created on first use; nothing is compiled until a kernel runs)."""
    global _jit
    if _jit is None:
        from .jit.backend import JitBackend

        _jit = JitBackend()
    return _jit


def source() -> str:
    """Where the kernels the ops call come from: '_C', 'JIT' or 'none' (not decided until a GPU was asked)."""
    if _C is None:
        return "none"
    return "_C" if _C is BUILT else "JIT"


def build_info() -> dict | None:
    """What the kernels the ops call were made from: _C's build, or the JIT's sources and runtime."""
    return dict(_C.build_info()) if _C is not None else None


def built_info() -> dict | None:
    """The built library's build_info, whichever backend the ops call; None without _C."""
    return dict(BUILT.build_info()) if BUILT is not None else None


def _built_reason(index: int) -> str | None:
    if BUILT is None:
        return LOAD_ERROR
    built_for = BUILT.build_info()["platform"]
    running = platform.torch_gpu_platform()
    if running == "none":
        return "no GPU: torch is a CPU-only build"
    if built_for != running:
        return f"platform: _C was built for {built_for} but torch is a {running} build; reinstall rocm_sd"
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return "no GPU: torch sees no GPU"
    why = BUILT.check_kernel_image(index)
    if why:
        targets = BUILT.build_info()["targets"]
        return f"arch: {platform.device_arch(index)} is not among the built targets ({targets}): {why}"
    return None


@functools.lru_cache(maxsize=None)
def _device_reason(index: int) -> str | None:
    """None if kernels can run on GPU `index` (and _C set to the backend that runs them), else why not."""
    global _C
    mode = config.current.kernels
    built = _built_reason(index) if mode != "jit" else "ROCM_SD_KERNELS=jit"
    if built is None or mode == "built" or platform.torch_gpu_platform() == "none":
        return built
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return "no GPU: torch sees no GPU"
    jit = jit_backend()
    why = jit.unavailable_reason()
    if why:
        return f"{built}; runtime compilation is not possible either: {why}"
    _C = jit
    return None


def unavailable_reason(device: torch.device) -> str | None:
    """None if kernels can run on `device`, else why not."""
    if device.type != "cuda":  # torch calls ROCm devices "cuda" too
        return LOAD_ERROR if BUILT is None else f"device: tensors are on {device.type}, kernels run on the GPU"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _device_reason(index)
