"""`python -m rocm_sd info`: platform, GPU, kernel library, and why any op would fall back."""
from __future__ import annotations

import importlib.metadata

import torch

from . import _ext, platform
from .ops import REGISTRY
from .version import __version__


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _sample_call_reasons(device: torch.device) -> dict[str, list[str] | None]:
    """Why each op's kernel could not run its first sample call (OpSpec.samples) on `device`: [] where it can;
    None for the ops hosting CK fusions, which have no kernel of their own (their default path is composed)."""
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    return {name: spec.supports(*spec.samples(device, dtype)[0]) if spec.kernel is not None else None
            for name, spec in REGISTRY.items()}


def _tuning_summary(device: torch.device) -> str:
    from .tune import TuningDB, device_key, validators

    if device.type != "cuda":
        return "not used on a CPU"
    db = TuningDB(device_key(device), validators(device))
    state = f"{len(db.results)} tuned problems" if db.results else "none yet (python -m rocm_sd.tune)"
    if db.defaults:
        state += f", under {len(db.defaults)} shipped defaults for this device"
    return f"{db.path}: {state}" + "".join(f"; {note}" for note in db.notes)


def run() -> int:
    mismatch = platform.torch_mismatch()
    rows = [("rocm_sd", __version__), ("torch", f"{torch.__version__} ({platform.runtime_version()})"
                                                + (f"; WARNING: {mismatch}" if mismatch else "")),
            ("diffusers", _version("diffusers")), ("transformers", _version("transformers"))]
    if platform.gpu_available():
        for i in range(torch.cuda.device_count()):
            arch = platform.device_arch(i)
            props = torch.cuda.get_device_properties(i)
            rows.append((f"GPU {i}", f"{props.name}, {arch}, {props.multi_processor_count} CUs/SMs"))
    else:
        rows.append(("GPU", "none visible to torch"))
    device = torch.device("cuda") if platform.gpu_available() else torch.device("cpu")
    _ext.unavailable_reason(device)  # settles where kernels come from (_C or the JIT) on a GPU
    build = _ext.built_info()
    if build:
        rows.append(("_C", f"loaded, built for {build['platform']} targets {build['targets']} "
                           f"(runtime {build['runtime_version']}, kernel sources {build.get('source_hash', 'unknown')})"))
        counts = {name: len(spec.ck_instances()) for name, spec in REGISTRY.items() if spec.ck_instances is not None}
        rows.append(("CK instances", ", ".join(f"{n} {name}" for name, n in counts.items()) if any(counts.values())
                     else "none (built on ROCm when Composable Kernel headers are found)"))
    else:
        rows.append(("_C", _ext.LOAD_ERROR))
    rows.append(("kernels from", _kernel_source()))
    source = {"_C": "_C", "JIT": "JIT, compiled at first use"}.get(_ext.source(), "")
    for op, reasons in _sample_call_reasons(device).items():
        if reasons is None:
            state = "vendor GEMM / convolution, then its rocm_sd epilogue op (a CK instance where tuned faster)"
        else:
            state = f"rocm_sd kernel ({source})" if not reasons else "PyTorch fallback: " + "; ".join(reasons)
        rows.append((f"op {op}", state))
    rows.extend(_untuned_attention(device))
    rows.append(("ops registered", ", ".join(f"rocm_sd::{name}" for name in REGISTRY)))
    rows.append(("precision='fp8'", _eight_bit(device, "fp8")))
    rows.append(("precision='int8'", _eight_bit(device, "int8")))
    rows.append(("tuning database", _tuning_summary(device)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


# Head dims of the models rocm_sd runs: SD1.5 / SD2 (40, 80, 160, 64), SDXL and the transformers (64, 128), the VAE's
# mid-block (512), and 256, the largest AOTriton's fused kernels take on some GPUs.
ATTENTION_HEAD_DIMS = (40, 64, 80, 128, 160, 256, 512)


def _untuned_attention(device: torch.device) -> list[tuple[str, str]]:
    """Per head dim, the path an untuned, unmasked fp16 attention call takes on this GPU, and why."""
    if device.type != "cuda":
        return [("untuned attention", "not applicable on a CPU (SDPA's CPU kernels run every call)")]
    from .ops.attention import untuned_path

    return [(f"attention d={dim} fp16", untuned_path(device, dim)) for dim in ATTENTION_HEAD_DIMS]


def _kernel_source() -> str:
    """Where the ops' kernels come from, and for the JIT its compiler, cache folder and what it compiled so far."""
    from . import config

    setting = f"ROCM_SD_KERNELS={config.current.kernels}"
    if _ext.source() == "_C":
        return f"_C ({setting})"
    if _ext.source() == "none":
        return f"none ({setting})"
    jit = _ext._C
    entries = len(list(jit.cache.folder.glob("*.bin"))) if jit.cache.folder.is_dir() else 0
    compiled = ", ".join(f"{unit} {arch} {seconds:.1f} s{' (cached)' if cached else ''}"
                         for (unit, arch), (seconds, cached) in jit.compiles.items())
    return (f"runtime-compiled (JIT) with {jit.compiler().label} ({setting}); cache {jit.cache.folder} ({entries} "
            f"entries)" + (f"; this run: {compiled}" if compiled else ""))


def _eight_bit(device: torch.device, precision: str) -> str:
    """The format optimize(precision=...) would use here, or why it would keep the model's dtype."""
    from .patch.precision import number_format

    fmt, why = number_format(device, precision)
    return f"{fmt} GEMMs" if fmt else f"not available: {why}"
