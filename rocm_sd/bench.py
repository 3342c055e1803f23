"""`python -m rocm_sd bench`: inference engines side by side, same pipeline, weights, prompt and seed.

Engines (shared/PERF.md names):
  eager                    diffusers as is (SDPA attention)
  compile                  torch.compile(unet, fullgraph=True)
  compile-reduce-overhead  diffusers' recommended recipe: channels_last, fused QKV projections, UNet and
                           VAE decode compiled with mode="reduce-overhead", fullgraph
  rocm_sd                  rocm_sd.optimize(pipe) with its default flags
  rocm_sd+compile          rocm_sd kernels (no rocm_sd graphs) under torch.compile reduce-overhead
  onnxruntime              the UNet exported with torch.onnx and run by ONNX Runtime (rocm_sd/onnx_engine.py);
                           a row saying why not when no ONNX Runtime with a GPU provider is installed
With --ablation, one more rocm_sd row per optimization flag, toggled from its default.

Per engine: the first call (compilation or capture included), then the median of --repeats calls,
peak memory, and agreement with the eager engine: PSNR of the image and max |difference| of the final
latents. Writes <out>/<date>-<model>-<device>.md and .json (layout in shared/PERF.md).
"""
from __future__ import annotations

import datetime
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

import numpy as np
import torch

from . import models, onnx_engine, patch, platform

ENGINES = ("eager", "compile", "compile-reduce-overhead", "rocm_sd", "rocm_sd+compile", "onnxruntime")
PROMPT = "a watercolor painting of a lighthouse at dawn"


def _optimize_flags() -> dict[str, bool]:
    """optimize()'s flags and their defaults, read from its signature: the ablation follows new flags."""
    return {name: p.default for name, p in inspect.signature(patch.optimize).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


@contextmanager
def _engine(name: str, pipe, flags: dict[str, bool]):
    """Sets `pipe` up for one engine and restores it afterwards."""
    unet, decode = pipe.unet, pipe.vae.decode
    if name.startswith("compile") or name == "rocm_sd+compile":
        torch._dynamo.reset()
    try:
        if name == "compile":
            pipe.unet = torch.compile(unet, fullgraph=True)
        elif name == "compile-reduce-overhead":
            pipe.unet.to(memory_format=torch.channels_last)
            pipe.vae.to(memory_format=torch.channels_last)
            pipe.fuse_qkv_projections()
            pipe.unet = torch.compile(unet, mode="reduce-overhead", fullgraph=True)
            pipe.vae.decode = torch.compile(decode, mode="reduce-overhead", fullgraph=True)
        elif name == "rocm_sd":
            patch.optimize(pipe, **flags)
        elif name == "rocm_sd+compile":
            patch.optimize(pipe, **{**flags, "cuda_graph": False})
            pipe.unet = torch.compile(unet, mode="reduce-overhead", fullgraph=True)
        elif name == "onnxruntime":
            providers, why = onnx_engine.providers_for(unet.device)
            if why:
                raise RuntimeError(why)
            pipe.unet = onnx_engine.OrtUNet(unet, providers)
        yield
    finally:
        if isinstance(pipe.unet, onnx_engine.OrtUNet):
            pipe.unet.close()
        pipe.unet = unet
        if name == "compile-reduce-overhead":
            pipe.vae.__dict__.pop("decode", None)
            pipe.unfuse_qkv_projections()
            pipe.unet.to(memory_format=torch.contiguous_format)
            pipe.vae.to(memory_format=torch.contiguous_format)
        if name.startswith("rocm_sd"):
            patch.revert(pipe)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two images with values in [0, 1]."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def _device_tag(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return torch.cuda.get_device_name(device).split()[-1].lower()


def _commit() -> str:
    if os.environ.get("ROCM_SD_COMMIT"):
        return os.environ["ROCM_SD_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _profile_table(generate, device: torch.device, rows: int = 30) -> str:
    """GPU time per op over one generation, torch profiler's table (device kernels, graph replays too)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        generate()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=120)


def run(model: str = "sd15", size: int | None = None, steps: int = 50, batch: int = 1, repeats: int = 3,
        warmup: int = 2, engines: tuple[str, ...] = ENGINES, ablation: bool = False, out_dir: str = "bench/results",
        seed: int = 0, profile: bool = False) -> list[dict]:
    from tqdm import tqdm

    on_gpu = platform.gpu_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.float16 if on_gpu else torch.float32
    size = size or models.default_size(model)
    pipe = models.build_sd_pipeline(model, device, dtype, seed=seed)
    conditioning = models.prompt_kwargs(pipe, PROMPT, "", batch)

    defaults = _optimize_flags()
    runs = [(engine, defaults, engine) for engine in engines]
    if ablation:
        for flag, default in defaults.items():
            runs.append(("rocm_sd", {**defaults, flag: not default}, f"rocm_sd {flag}={'on' if not default else 'off'}"))

    def generate():
        final = {}

        def keep_latents(_pipe, step, _t, kwargs):
            final["latents"] = kwargs["latents"]
            return kwargs

        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            images = pipe(**conditioning, num_inference_steps=steps,
                          generator=torch.Generator(device).manual_seed(seed), height=size, width=size,
                          output_type="np", callback_on_step_end=keep_latents,
                          callback_on_step_end_tensor_inputs=["latents"]).images
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter() - start, images, final["latents"].float()

    rows, eager_out, profiles = [], None, {}
    progress = tqdm(total=len(runs) * (1 + warmup + repeats), desc="rocm_sd bench", unit="run")
    for engine, flags, label in runs:
        why_not = onnx_engine.providers_for(device)[1] if engine == "onnxruntime" else None
        if why_not:  # an optional engine: a row that says why, not a failed benchmark
            rows.append({"engine": engine, "label": label, "model": model, "skipped": why_not})
            progress.update(1 + warmup + repeats)
            continue
        if on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        with _engine(engine, pipe, flags):
            first_s, images, latents = generate()
            progress.update()
            for _ in range(warmup):
                generate()
                progress.update()
            times = []
            for _ in range(repeats):
                times.append(generate()[0])
                progress.update()
            if profile:
                profiles[label] = _profile_table(generate, device)
        if eager_out is None and engine == "eager":
            eager_out = (images, latents)
        median = statistics.median(times)
        row = {"engine": engine, "label": label, "model": model, "height": size, "width": size, "steps": steps,
               "batch": batch, "median_s": round(median, 4), "it_per_s": round(steps / median, 1),
               "first_s": round(first_s, 3),
               "peak_mb": round(torch.cuda.max_memory_allocated() / 2**20) if on_gpu else None}
        if label != engine:
            row["flags"] = flags
        if eager_out is not None:
            row["psnr_db"] = round(psnr(eager_out[0], images), 1)
            row["max_latent_diff"] = float((eager_out[1] - latents).abs().max())
        rows.append(row)
    progress.close()

    table = _table(rows)
    for label, text in profiles.items():
        table += f"\n\nProfile of one generation, {label} (sorted by device time):\n\n```\n{text}\n```"
    print(table)
    if out_dir:
        _write(rows, table, model, device, out_dir, size, steps, batch)
    return rows


def _table(rows: list[dict]) -> str:
    eager = next((r["median_s"] for r in rows if r["label"] == "eager" and "median_s" in r), None)
    lines = ["| engine | median s | it/s | vs eager | first call s | peak MB | PSNR dB | max latent diff |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['label']} | not run: {r['skipped']} | | | | | | |")
            continue
        speedup = f"{eager / r['median_s']:.2f}x" if eager else "-"
        psnr = r.get("psnr_db", "-")
        diff = f"{r['max_latent_diff']:.3g}" if "max_latent_diff" in r else "-"
        lines.append(f"| {r['label']} | {r['median_s']:.3f} | {r['it_per_s']} | {speedup} | {r['first_s']:.1f} | "
                     f"{r['peak_mb'] if r['peak_mb'] is not None else '-'} | {psnr} | {diff} |")
    return "\n".join(lines)


def bar_chart(rows: list[dict], path: str, title: str) -> None:
    """Median seconds per engine as a horizontal bar chart (PNG, drawn with Pillow: no plotting stack)."""
    from PIL import Image, ImageDraw

    label_w, bar_w, row_h, pad = 260, 420, 26, 12
    width, height = label_w + bar_w + 90, pad * 3 + row_h * (len(rows) + 1)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((pad, pad), title, fill="black")
    rows = [r for r in rows if "median_s" in r]
    longest = max(r["median_s"] for r in rows)
    for i, r in enumerate(rows):
        y = pad * 2 + row_h * (i + 1)
        length = max(1, int(bar_w * r["median_s"] / longest))
        color = (200, 60, 40) if r["engine"].startswith("rocm_sd") else (90, 110, 140)
        draw.text((pad, y + 6), r["label"][:40], fill="black")
        draw.rectangle([label_w, y + 4, label_w + length, y + row_h - 4], fill=color)
        draw.text((label_w + length + 6, y + 6), f"{r['median_s']:.3f} s", fill="black")
    image.save(path)


def _write(rows, table, model, device, out_dir, size, steps, batch) -> None:
    date = datetime.date.today().isoformat()
    stem = os.path.join(out_dir, f"{date}-{model}-{_device_tag(device)}")
    os.makedirs(out_dir, exist_ok=True)
    meta = {"date": date, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "commit": _commit(),
            "command": "python -m rocm_sd " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("__main__.py")
            else f"rocm_sd.bench.run(model={model!r}, size={size}, steps={steps}, batch={batch})"}
    with open(stem + ".json", "w") as f:
        json.dump({**meta, "results": rows}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"# rocm_sd bench: {model} {size}x{size}, {steps} steps, batch {batch} (+CFG)\n\n")
        f.write("".join(f"- {k}: `{v}`\n" for k, v in meta.items()))
        f.write("\n" + table + "\n")
    bar_chart(rows, stem + ".png", f"{model} {size}x{size}, {steps} steps, batch {batch}: median seconds "
              f"({meta['device']})")
    print(f"written: {stem}.md/.json/.png")
