"""What torch runs on: vendor, GPU architecture names as the toolchains spell them."""
from __future__ import annotations

import torch


def torch_gpu_platform() -> str:
    """'hip' for a ROCm build of torch, 'cuda' for a CUDA build, 'none' for a CPU-only build."""
    if getattr(torch.version, "hip", None):
        return "hip"
    if torch.version.cuda:
        return "cuda"
    return "none"


def gpu_available() -> bool:
    return torch_gpu_platform() != "none" and torch.cuda.is_available()


def device_arch(device: torch.device | int | None = None) -> str:
    """gfx942, gfx1100, ... on ROCm (without target features); sm_90 on CUDA."""
    props = torch.cuda.get_device_properties(device)
    arch = getattr(props, "gcnArchName", "")
    if torch_gpu_platform() == "hip" and arch:
        return arch.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def runtime_version() -> str:
    if torch_gpu_platform() == "hip":
        return f"HIP {torch.version.hip}"
    if torch_gpu_platform() == "cuda":
        return f"CUDA {torch.version.cuda}"
    return "CPU only"
