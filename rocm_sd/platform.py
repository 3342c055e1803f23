"""What torch runs on: vendor, GPU architecture names as the toolchains spell them."""
from __future__ import annotations

import os

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


# The device files of each vendor's kernel driver, and the torch build that can use that GPU.
GPU_DRIVERS = {"AMD": ("/dev/kfd", "hip", "ROCm"), "NVIDIA": ("/dev/nvidiactl", "cuda", "CUDA")}


def torch_mismatch(exists=os.path.exists) -> str | None:
    """Why this torch cannot use the GPU this machine has (a driver's device file is there, but torch is not built for
    it: e.g. the CUDA torch pip installs by default, ~3 GB, on an AMD machine), or None."""
    for vendor, (device_file, build, runtime) in GPU_DRIVERS.items():
        if exists(device_file) and getattr(torch.version, build, None) is None:
            return (f"this machine has an {vendor} GPU ({device_file}) but this torch has no {runtime} support: "
                    f"install the {runtime} build of torch (pytorch.org), then reinstall rocm_sd")
    return None
