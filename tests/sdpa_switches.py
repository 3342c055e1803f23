"""SDPA's fused backends switched off, shared by tests and benchmarks: with them off, an NVIDIA GPU stands in for the
ROCm GPUs where SDPA has no fused kernel and takes its math path (rocm_sd/ops/attention.py)."""
import contextlib

import torch

FUSED = ("flash", "mem_efficient", "cudnn")


@contextlib.contextmanager
def sdpa_switched(enabled: bool, backends=FUSED):
    """SDPA's `backends` switched on or off inside the block (torch.backends.cuda.enable_<backend>_sdp), as they
    were after it."""
    cuda = torch.backends.cuda
    saved = {name: getattr(cuda, f"{name}_sdp_enabled")() for name in backends}
    for name in backends:
        getattr(cuda, f"enable_{name}_sdp")(enabled)
    try:
        yield
    finally:
        for name, was in saved.items():
            getattr(cuda, f"enable_{name}_sdp")(was)
