"""What a tuning result belongs to: the device it was measured on, and the software it was measured with.

Keyed as AMD's own stacks key theirs (shared/reference/ck_tuning.md section 2.5): MIOpen names its
databases by architecture and CU count, TunableOp and ONNX Runtime reject a whole file when a validator
(library version, runtime, arch with target features) differs. So:
  DeviceKey   full architecture name with target features (gfx942:sramecc+:xnack-, sm_90), CU/SM count
              (MI300X partition modes change it), wave size: it names the file;
  validators  rocm_sd version, hash of the kernel sources compiled into _C, HIP/CUDA runtime, driver,
              torch: a file whose validators differ is not used (results of other code or drivers).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import torch

from .. import _ext, platform
from ..version import __version__


@dataclass(frozen=True)
class DeviceKey:
    backend: str     # hip, cuda, or cpu
    arch: str        # gfx942:sramecc+:xnack-, gfx1100, sm_90, cpu
    units: int       # compute units (AMD) or SMs (NVIDIA)
    wave: int        # wave/warp size: 64 on CDNA, 32 on RDNA (wave32) and NVIDIA

    @property
    def file_stem(self) -> str:
        """gfx942_sramecc+_xnack-_304cu_w64, sm_90_132sm_w32: readable, and valid on every file system."""
        unit = "cu" if self.backend == "hip" else "sm"
        return re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{self.arch}_{self.units}{unit}_w{self.wave}")

    def as_dict(self) -> dict:
        return asdict(self)


def device_key(device: torch.device | int | None = None) -> DeviceKey:
    """The key of a GPU as torch sees it (the current one by default); a CPU key without a GPU."""
    if not platform.gpu_available():
        return DeviceKey("cpu", "cpu", 0, 1)
    props = torch.cuda.get_device_properties(device)
    backend = platform.torch_gpu_platform()
    arch = getattr(props, "gcnArchName", "") if backend == "hip" else ""
    arch = arch or platform.device_arch(device)
    wave = getattr(props, "warp_size", 64 if backend == "hip" and arch.startswith("gfx9") else 32)
    return DeviceKey(backend, arch, props.multi_processor_count, wave)


def validators(device: torch.device | int | None = None) -> dict[str, str]:
    """The software a result depends on; any difference makes a database file stale."""
    build = _ext.build_info()
    driver = "none"
    if build is not None and platform.gpu_available():
        driver = str(_ext._C.device_info(_index(device))["driver_version"])
    return {
        "rocm_sd": __version__,
        "kernels": build.get("source_hash", "unknown") if build is not None else "none (PyTorch only)",
        "runtime": platform.runtime_version(),
        "driver": driver,
        "torch": torch.__version__,
    }


def _index(device: torch.device | int | None) -> int:
    if isinstance(device, int):
        return device
    if device is None or device.index is None:
        return torch.cuda.current_device()
    return device.index
