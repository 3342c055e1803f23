"""`python -m rocm_sd demo`: one image, reference pipeline vs rocm_sd-optimized, same weights and seed.

On a GPU: the full SD1.5 architecture (random weights), fp16, 512x512. On a CPU: the tiny
architecture in fp32, so that the whole path (patching, dispatch, fallback) runs in seconds.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch

from . import config, dispatch, models, patch, platform
from .bench import CPU_TIMES, psnr


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _save_png(image: np.ndarray, path: str) -> None:
    from PIL import Image

    Image.fromarray((np.clip(image, 0, 1) * 255).round().astype(np.uint8)).save(path)


def _print_fallbacks(seen: dict[str, list[str]]) -> None:
    """The ops that fell back to PyTorch. The dispatcher logs each (op, reason) the first time (unless ROCM_SD_LOG=0),
    so then the ops are named here, not their reasons again; otherwise one line per reason, naming its ops."""
    if seen and config.current.log_fallbacks:
        print(f"fell back to PyTorch: {', '.join(seen)} (the reasons are in the log)")
        return
    by_reason: dict[str, list[str]] = {}
    for op, reasons in seen.items():
        for reason in reasons:
            by_reason.setdefault(reason, []).append(op)
    for reason, ops in by_reason.items():
        print(f"{', '.join(ops)} fell back to PyTorch because: {reason}")


def run(out_dir: str = "rocm_sd_demo", arch: str | None = None, steps: int | None = None, size: int | None = None,
        repeats: int = 3, prompt: str = "a watercolor painting of a lighthouse at dawn", seed: int = 0) -> dict:
    on_gpu = platform.gpu_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    arch = arch or ("sd15" if on_gpu else "tiny")
    dtype = models.gpu_dtype(arch) if on_gpu else torch.float32
    steps = steps or (20 if on_gpu else 4)
    size = size or models.default_size(arch)
    print(f"rocm_sd demo: {arch} architecture (random weights), {size}x{size}, {steps} steps, {dtype}, "
          f"on {torch.cuda.get_device_name(device) if on_gpu else 'CPU'}", flush=True)
    if not on_gpu:
        mismatch = platform.torch_mismatch()
        if mismatch:
            print(f"WARNING: {mismatch}", flush=True)

    pipe = models.build_sd_pipeline(arch, device, dtype, seed=seed)
    conditioning = models.prompt_kwargs(pipe, prompt)

    def generate() -> tuple[float, np.ndarray]:
        generator = torch.Generator(device).manual_seed(seed)
        _sync(device)
        start = time.perf_counter()
        images = pipe(**conditioning, num_inference_steps=steps,
                      generator=generator, height=size, width=size, output_type="np").images
        _sync(device)
        return time.perf_counter() - start, images[0]

    def timed() -> tuple[float, float, np.ndarray]:
        first, image = generate()
        times = [generate()[0] for _ in range(repeats)]
        return first, statistics.median(times), image

    ref_first, ref_s, ref_image = timed()
    patch.optimize(pipe)
    dispatch.reset_stats()
    opt_first, opt_s, opt_image = timed()
    backend_calls = dispatch.stats()  # op calls run from Python: graph replays do not count here
    replaced = patch.report(pipe)
    patch.revert(pipe)

    os.makedirs(out_dir, exist_ok=True)
    ref_path, opt_path = os.path.join(out_dir, "reference.png"), os.path.join(out_dir, "rocm_sd.png")
    _save_png(ref_image, ref_path)
    _save_png(opt_image, opt_path)

    max_diff = float(np.abs(ref_image.astype(np.float64) - opt_image.astype(np.float64)).max())
    psnr_db = psnr(ref_image, opt_image)
    print()
    print("| pipeline  | first call s | median s | speed-up | max abs diff | PSNR dB |")
    print("|-----------|-------------:|---------:|---------:|-------------:|--------:|")
    print(f"| reference | {ref_first:12.3f} | {ref_s:8.3f} |    1.00x |            - |       - |")
    speedup = f"{ref_s / opt_s:7.2f}x" if on_gpu else "       -"  # a CPU's ratio is noise (CPU_TIMES)
    print(f"| rocm_sd   | {opt_first:12.3f} | {opt_s:8.3f} | {speedup} | {max_diff:12.2e} | {psnr_db:7.1f} |")
    if not on_gpu:
        print(f"\n{CPU_TIMES}")
    print()
    print("report (what optimize() replaced; how graphed calls ran):")
    for component, counts in replaced.items():
        print(f"  {component}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    print(f"op calls by backend: {backend_calls}")
    _print_fallbacks(dispatch.fallback_reasons_seen())
    print(f"images: {ref_path}, {opt_path}")
    return {"arch": arch, "reference_s": ref_s, "rocm_sd_s": opt_s, "max_diff": max_diff, "psnr_db": psnr_db,
            "calls": backend_calls, "replaced": replaced}
