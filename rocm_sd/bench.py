"""`python -m rocm_sd bench`: inference engines side by side, same pipeline, weights, prompt and seed.

Engines (docs/performance.md names):
  eager                    diffusers as is (SDPA attention)
  compile                  torch.compile(unet, fullgraph=True); for the diffusion transformers the diffusers docs'
                           recipe: torch.compile(transformer, fullgraph=True) for SD3 / SD3.5, regional compilation
                           (transformer.compile_repeated_blocks(fullgraph=True)) for Flux
  compile-reduce-overhead  diffusers' recommended recipe: channels_last, fused QKV projections, UNet and
                           VAE decode compiled with mode="reduce-overhead", fullgraph
  rocm_sd                  rocm_sd.optimize(pipe) with its default flags
  rocm_sd+compile          rocm_sd kernels (no rocm_sd graphs) under torch.compile reduce-overhead (UNets), or under
                           the model's compile recipe above (diffusion transformers)
  onnxruntime              the UNet exported with torch.onnx and run by ONNX Runtime (rocm_sd/onnx_engine.py);
                           a row saying why not when no ONNX Runtime with a GPU provider is installed
With --ablation, one more rocm_sd row per optimization flag, toggled from its default (--ablation FLAG,FLAG: those
flags only).

Modes (MODES: optimize()'s options, which change images or skip work), only when named in --engines; they run
after the other engines, with a rocm_sd row added before them if none was asked for:
  rocm_sd-fp8              rocm_sd.optimize(pipe, precision="fp8")
  rocm_sd-int8             rocm_sd.optimize(pipe, precision="int8")
  rocm_sd-deepcache        rocm_sd.optimize(pipe, cache="deepcache", cache_interval=3, cache_branch=0)
  rocm_sd-adaptive         rocm_sd.optimize(pipe, cache="adaptive") (cache_threshold 0.15)
  rocm_sd-fbcache          rocm_sd.optimize(pipe, cache="fbcache") (the diffusion transformers; the published threshold)
  rocm_sd-teacache         rocm_sd.optimize(pipe, cache="teacache") (the diffusion transformers; the published threshold)
  rocm_sd-fp8-fbcache      both: fp8 linear layers and the fbcache step cache (the diffusion transformers)
  rocm_sd-fp8-teacache     both: fp8 linear layers and the teacache step cache (the diffusion transformers)
  rocm_sd-attnfp8          rocm_sd.optimize(pipe, attention_precision="fp8")
Their rows add PSNR against the rocm_sd (fp16) image (psnr_vs_fp16_db) and the table a speed-up against the rocm_sd
row. A mode that optimize() could not apply here (report() or the log says why: no FP8 on this GPU, a CPU) is a
row saying so, not fp16 numbers under its name.

Per engine: the first call (compilation or capture included), then the median of --repeats calls,
peak memory, and agreement with the eager engine: PSNR of the image and max |difference| of the final
latents; and the median time of one call of the denoiser (UNet or transformer) on the inputs the eager engine gave
it at its first step (ms/step), with its share of device time by kind of kernel under --profile. Prints the table and
appends the run to <out>/data/<model>-<device>.jsonl (see "Result files" below; `python bench/render_results.py`
renders the markdown), with a chart of it in <out>/<model>-<device>.png. <out> is a folder of the user's unless asked
(results_folder()): the repository's bench/results takes a run only with --out bench/results.
"""
from __future__ import annotations

import datetime
import logging
import inspect
import json
import math
import os
import re
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from . import models, onnx_engine, patch, platform
from .engines import ENGINES, MODES, TRANSFORMER_ENGINES, results_folder
from .patch import pipeline
from .version import git_commit

log = logging.getLogger("rocm_sd")
PROMPT = "a watercolor painting of a lighthouse at dawn"
# Said under the times of a run on a CPU (here and by `demo`): they vary by tens of percent from run to run of the
# same code, and rocm_sd's kernels are not in them.
CPU_TIMES = ("On a CPU every op runs PyTorch's code (rocm_sd's kernels run on GPUs): these times and their ratios "
             "say nothing about GPU speed; the run checks that the optimized pipeline gives the same image.")


def _optimize_flags() -> dict[str, bool | None]:
    """optimize()'s on/off flags and their defaults, read from its signature: the ablation follows new flags (its
    options, which take values, are the modes, even a True / False one such as precision_convs). None: the flag's
    default depends on the mode or the platform (fuse_qkv: on with an 8-bit precision; vae_tiles: on with ROCm)."""
    return {name: p.default for name, p in inspect.signature(patch.optimize).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and name in pipeline.FLAG_NAMES}


def optimize_with_options(pipe, options: dict, **flags) -> list[str]:
    """rocm_sd.optimize(pipe, **flags, **options); returns why `options` (precision, cache...) did not take effect
    (patch.pipeline.skipped_options: no FP8 on this GPU, a CPU...), [] when they did."""
    patch.optimize(pipe, **flags, **options)
    return pipeline.skipped_options(pipe, options)


def mode_text(options: dict) -> str:
    """'precision=fp8', 'cache=deepcache, cache_interval=3': optimize()'s options as a user types them."""
    return ", ".join(f"{k}={v}" for k, v in options.items())


def _apply_mode(name: str, pipe, flags: dict, device: torch.device) -> str | None:
    """optimize() with mode `name`'s options; why they did not apply on `device`, else None."""
    skipped = optimize_with_options(pipe, MODES[name], **flags)
    return f"{mode_text(MODES[name])} not applied on {device_name(device)}: {'; '.join(skipped)}" if skipped else None


def _compile_transformer(pipe) -> None:
    """The diffusers docs' torch.compile recipe for the pipeline's transformer: regional compilation of the repeated
    blocks where the model declares them (Flux), else the whole model, fullgraph."""
    if getattr(pipe.transformer, "_repeated_blocks", None):
        pipe.transformer.compile_repeated_blocks(fullgraph=True)
    else:
        pipe.transformer = torch.compile(pipe.transformer, fullgraph=True)


def _uncompile_transformer(transformer) -> None:
    """Undo compile_repeated_blocks (it compiles each block in place)."""
    for module in transformer.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None


@contextmanager
def _transformer_engine(name: str, pipe, flags: dict[str, bool | None], device: torch.device):
    """_engine for a diffusion-transformer pipeline (SD3, Flux)."""
    transformer = pipe.transformer
    if "compile" in name:
        torch._dynamo.reset()
    why_not = None
    try:
        if name in MODES:
            why_not = _apply_mode(name, pipe, flags, device)
        elif name == "compile":
            _compile_transformer(pipe)
        elif name == "rocm_sd":
            patch.optimize(pipe, **flags)
        elif name == "rocm_sd+compile":
            patch.optimize(pipe, **{**flags, "cuda_graph": False})
            _compile_transformer(pipe)
        elif name != "eager":
            why_not = f"no {name} engine for the diffusion transformers (engines: {', '.join(TRANSFORMER_ENGINES)})"
        yield why_not
    finally:
        pipe.transformer = transformer
        _uncompile_transformer(transformer)
        if name.startswith("rocm_sd"):
            patch.revert(pipe)


@contextmanager
def _engine(name: str, pipe, flags: dict[str, bool | None], device: torch.device):
    """Sets `pipe` up for one engine and restores it afterwards; yields why the engine cannot run as named (a mode
    optimize() could not apply here), else None."""
    if getattr(pipe, "unet", None) is None:
        with _transformer_engine(name, pipe, flags, device) as why_not:
            yield why_not
        return
    unet, decode = pipe.unet, pipe.vae.decode
    if name.startswith("compile") or name == "rocm_sd+compile":
        torch._dynamo.reset()
    why_not = None
    try:
        if name in MODES:
            why_not = _apply_mode(name, pipe, flags, device)
        elif name == "compile":
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
        yield why_not
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


def _in_order(engines: tuple[str, ...]) -> list[str]:
    """The engines as asked, modes last, after a rocm_sd row (added if missing) that they compare against."""
    modes = [e for e in engines if e in MODES]
    others = [e for e in engines if e not in MODES]
    if modes and "rocm_sd" not in others:
        others.append("rocm_sd")
    return others + modes


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two images with values in [0, 1]."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def _profile_table(generate, device: torch.device, rows: int = 30) -> str:
    """GPU time per op over one generation, torch profiler's table (device kernels, graph replays too)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        generate()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=120)


# Kernel names by kind, for the device-time split of --profile (the first pattern that matches decides).
KERNEL_KINDS = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|softmax|cudnn_generated_fort_native_sdpa", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|cublas|sm90_xmma|nvjet|matmul|Cijk|wgmma|xmma", re.I)),
    ("convolution", re.compile(r"conv|implicit|winograd|miopen|fprop|dgrad", re.I)),
)


def kernel_kind(name: str) -> str:
    """'attention', 'gemm', 'convolution' or 'norm+elementwise' (everything else: norms, modulation, activations,
    copies, concatenations, rotary embeddings) for a device kernel's name."""
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), "norm+elementwise")


def _device_time_split(call, device: torch.device) -> dict[str, float]:
    """Share of device time per kernel kind over one `call` (torch profiler; graph replays show their kernels)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize(device)
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[kernel_kind(event.name)] = totals.get(kernel_kind(event.name), 0.0) + event.device_time
    whole = sum(totals.values()) or 1.0
    return {kind: round(100 * t / whole, 1) for kind, t in sorted(totals.items())}


class _StepRecorder:
    """Keeps the arguments of the denoiser's first call in a generation, so that every engine is timed on the same
    step."""

    def __init__(self, model):
        self.args = None
        self.handle = model.register_forward_pre_hook(self._keep, with_kwargs=True)

    def _keep(self, module, args, kwargs):
        if self.args is None:
            clone = lambda t: t.clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
            self.args = (tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()})
        self.handle.remove()


def _one_step(pipe, step_args) -> None:
    """One call of the denoiser on `step_args` (graph replay or compiled code included, as the pipeline calls it)."""
    args, kwargs = step_args
    with torch.no_grad():
        models.denoiser(pipe)(*args, **kwargs)


def _step_ms(pipe, step_args, device: torch.device, repeats: int) -> float:
    """Median wall milliseconds of _one_step, synchronised, after two untimed calls."""
    times = []
    for _ in range(repeats + 2):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        _one_step(pipe, step_args)
        torch.cuda.synchronize(device)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times[2:])


def run(model: str = "sd15", size: int | None = None, steps: int | None = None, batch: int = 1, repeats: int = 3,
        warmup: int = 2, engines: tuple[str, ...] = ENGINES, ablation: bool | tuple[str, ...] = False,
        out_dir: str | None = None, seed: int = 0, profile: bool = False) -> list[dict]:
    """out_dir: the results folder (default results_folder(); '' writes none)."""
    from tqdm import tqdm

    out_dir = str(results_folder()) if out_dir is None else out_dir

    on_gpu = platform.gpu_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = models.gpu_dtype(model) if on_gpu else torch.float32
    size = size or models.default_size(model)
    steps = steps or models.default_steps(model)
    if models.is_transformer(model):
        engines = tuple(e for e in engines if e in TRANSFORMER_ENGINES or e in MODES)
    if out_dir:  # a data file that cannot take the run says so now, not after the benchmark
        read_runs(data_path(out_dir, model, device_name(device)))
    pipe = models.build_sd_pipeline(model, device, dtype, seed=seed)
    conditioning = models.prompt_kwargs(pipe, PROMPT, "", batch)

    defaults = _optimize_flags()
    runs = [(engine, defaults, engine) for engine in _in_order(engines)]
    if ablation:
        for flag, default in defaults.items():
            if isinstance(ablation, tuple) and flag not in ablation:
                continue
            toggled = not pipeline.FLAGS[pipeline.FLAG_NAMES.index(flag)].default_for({})  # the ablation runs fp16
            runs.append(("rocm_sd", {**defaults, flag: toggled}, f"rocm_sd {flag}={'on' if toggled else 'off'}"))

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

    rows, profiles = [], {}
    kept = {"eager": None, "fp16": None, "step_args": None}  # the eager images and latents, rocm_sd's image, the step
    progress = tqdm(total=len(runs) * (1 + warmup + repeats), desc="rocm_sd bench", unit="run")

    def run_engine(engine: str, label: str, flags: dict, recorder) -> dict:
        """One engine's row: its generations, step time, profile, agreement with eager (and rocm_sd)."""
        with _engine(engine, pipe, flags, device) as why_not:
            if why_not:  # a mode this device or build cannot run: its numbers would be rocm_sd's fp16 ones
                progress.update(1 + warmup + repeats)
                return {"engine": engine, "label": label, "model": model, "options": MODES.get(engine),
                        "skipped": why_not}
            first_s, images, latents = generate()
            if recorder is not None:
                kept["step_args"] = recorder.args
            step_args = kept["step_args"]
            progress.update()
            for _ in range(warmup):
                generate()
                progress.update()
            times = []
            for _ in range(repeats):
                times.append(generate()[0])
                progress.update()
            # A step cache decides per call from the calls before it: one call repeated alone is not a step of it
            caches_steps = "cache" in (MODES.get(engine) or {})
            step_ms = _step_ms(pipe, step_args, device, repeats) if step_args is not None and not caches_steps \
                else None
            split = _device_time_split(lambda: _one_step(pipe, step_args), device) \
                if profile and step_args is not None else None
            if profile:  # the transformers: one step (their generations are long); the UNets: one generation
                profiles[label] = _profile_table(
                    (lambda: _one_step(pipe, step_args)) if models.is_transformer(model) and step_args
                    else generate, device)
        if kept["eager"] is None and engine == "eager":
            kept["eager"] = (images, latents)
        if kept["fp16"] is None and label == "rocm_sd":
            kept["fp16"] = images
        median = statistics.median(times)
        row = {"engine": engine, "label": label, "model": model, "height": size, "width": size, "steps": steps,
               "batch": batch, "median_s": round(median, 4), "it_per_s": round(steps / median, 1),
               "first_s": round(first_s, 3),
               "peak_mb": round(torch.cuda.max_memory_allocated() / 2**20) if on_gpu else None}
        if step_ms is not None:
            row["step_ms"] = round(step_ms, 2)
        if split is not None:
            row["step_device_time_pct"] = split
        if label != engine:
            row["flags"] = flags
        if kept["eager"] is not None:
            row["psnr_db"] = round(psnr(kept["eager"][0], images), 1)
            row["max_latent_diff"] = float((kept["eager"][1] - latents).abs().max())
        if engine in MODES:
            row["options"] = MODES[engine]
            if kept["fp16"] is not None:
                row["psnr_vs_fp16_db"] = round(psnr(kept["fp16"], images), 1)
        return row

    for engine, flags, label in runs:
        why_not = onnx_engine.providers_for(device)[1] if engine == "onnxruntime" else None
        if why_not:  # an optional engine: a row that says why, not a failed benchmark
            rows.append({"engine": engine, "label": label, "model": model, "skipped": why_not})
            progress.update(1 + warmup + repeats)
            continue
        if on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        recorder = _StepRecorder(models.denoiser(pipe)) if kept["step_args"] is None and on_gpu else None
        try:
            rows.append(run_engine(engine, label, flags, recorder))
        except Exception as error:  # noqa: BLE001 - one engine failing (a compile error) must not lose the others
            if recorder is not None:
                recorder.handle.remove()
            why = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
            rows.append({"engine": engine, "label": label, "model": model,
                         "skipped": f"failed: {type(error).__name__}: {why}"})
            log.warning("bench: %s failed: %s", label, error)
    progress.close()

    table = engine_table(rows)
    splits = [r for r in rows if "step_device_time_pct" in r]
    if splits:
        table += "\n\nDevice time of one denoiser step by kind of kernel (%):\n\n" + "\n".join(
            f"- {r['label']}: " + ", ".join(f"{k} {v}" for k, v in r["step_device_time_pct"].items()) for r in splits)
    for label, text in profiles.items():
        what = profiled(model, kept["step_args"])
        table += f"\n\nProfile of {what}, {label} (sorted by device time):\n\n```\n{text}\n```"
    print(table)
    if not on_gpu:
        print(f"\n{CPU_TIMES}")
    if out_dir:
        _write(rows, profiles, model, device, out_dir, size, steps, batch, profiled(model, kept["step_args"]))
    return rows


def engine_table(rows: list[dict]) -> str:
    """The table of one run. Runs with modes (MODES) get two more columns: speed-up against the run's rocm_sd row and
    PSNR against its image."""
    def median_of(label):
        return next((r["median_s"] for r in rows if r["label"] == label and "median_s" in r), None)

    eager, fp16 = median_of("eager"), median_of("rocm_sd")
    modes = any(r.get("engine") in MODES for r in rows)
    steps = any("step_ms" in r for r in rows)
    header = ["engine", "median s", "it/s", "vs eager"] + (["vs rocm_sd"] if modes else []) + (
        ["ms/step"] if steps else []) + ["first call s", "peak MB", "PSNR dB"] + (
        ["PSNR vs rocm_sd dB"] if modes else []) + ["max latent diff"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['label']} | not run: {r['skipped']} |" + " |" * (len(header) - 2))
            continue
        cells = [r["label"], f"{r['median_s']:.3f}", r["it_per_s"], f"{eager / r['median_s']:.2f}x" if eager else "-"]
        if modes:
            cells.append(f"{fp16 / r['median_s']:.2f}x" if fp16 else "-")
        if steps:
            cells.append(f"{r['step_ms']:.1f}" if "step_ms" in r else "-")
        cells += [f"{r['first_s']:.1f}", r["peak_mb"] if r["peak_mb"] is not None else "-", r.get("psnr_db", "-")]
        if modes:
            cells.append(r.get("psnr_vs_fp16_db", "-"))
        cells.append(f"{r['max_latent_diff']:.3g}" if "max_latent_diff" in r else "-")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def bar_chart(rows: list[dict], path: str | os.PathLike | BinaryIO, title: str) -> None:
    """Median seconds per engine as a horizontal bar chart (PNG, drawn with Pillow: no plotting stack)."""
    from PIL import Image, ImageDraw

    rows = [r for r in rows if "median_s" in r]
    label_w, bar_w, row_h, pad = 260, 420, 26, 12
    width, height = label_w + bar_w + 90, pad * 3 + row_h * (len(rows) + 1)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((pad, pad), title, fill="black")
    longest = max(r["median_s"] for r in rows)
    for i, r in enumerate(rows):
        y = pad * 2 + row_h * (i + 1)
        length = max(1, int(bar_w * r["median_s"] / longest))
        color = (200, 60, 40) if r["engine"].startswith("rocm_sd") else (90, 110, 140)
        draw.text((pad, y + 6), r["label"][:40], fill="black")
        draw.rectangle([label_w, y + 4, label_w + length, y + row_h - 4], fill=color)
        draw.text((label_w + length + 6, y + 6), f"{r['median_s']:.3f} s", fill="black")
    image.save(path, format="PNG")


def chart_title(run: dict) -> str:
    """The chart's title for one run of `python -m rocm_sd bench` (the renderer draws the same)."""
    r = next((r for r in run["results"] if "median_s" in r), {})
    return (f"{r.get('model', run['bench'])} {r.get('width')}x{r.get('height')}, {r.get('steps')} steps, batch "
            f"{r.get('batch')}: median seconds ({run['device']}, {run['commit'][:7]}, {run['date']})")


def profiled(model: str, step_args) -> str:
    """What --profile's tables cover: one transformer step, or one generation (the UNets; any model on a CPU)."""
    return "one transformer step" if models.is_transformer(model) and step_args else "one generation"


def _write(rows, profiles, model, device, out_dir, size, steps, batch, what_profiled: str) -> None:
    command = ("python -m rocm_sd " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("__main__.py")
               else f"rocm_sd.bench.run(model={model!r}, size={size}, steps={steps}, batch={batch})")
    extra = {"profiles": profiles, "profiled": what_profiled} if profiles else {}
    path, run = append_run(out_dir, model, run_meta(device_name(device), command), rows, **extra)
    chart = Path(out_dir) / (path.stem + ".png")
    if any("median_s" in r for r in rows):
        bar_chart(rows, str(chart), chart_title(run))
    print(f"appended run {run['run']} to {path}" + (f"; chart: {chart}" if chart.exists() else ""))


# Result files. One JSON Lines file per benchmark and device, <out>/data/<bench>-<device>.jsonl: one line per run,
# appended (lines are never edited); docs/results.md says why JSON Lines and how to read them. A line is one JSON
# object:
#   run      "<date>-<bench>-<commit[:7]>-<device>" (a suffix -2, -3... if taken): the run's name, cited in docs
#   bench, date, device, commit, command      what ran, where, from which source, how (RUN_KEYS: always there)
#   torch, note, ... any other facts of the run; results: the benchmark's rows, as the benchmark defines them
# `python bench/render_results.py` renders the markdown pages from these files.
RUN_KEYS = ("run", "bench", "date", "device", "commit", "command")
LOCK_TIMEOUT_S = 120.0


class ResultsError(ValueError):
    """A results data file that cannot be read or appended to; the message names the file (and line)."""


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'AMD Instinct MI300X' -> 'mi300x': the device part of a data file's name."""
    lower = name.lower()
    for key in ("h200", "h100", "a100", "l40s", "mi355x", "mi350x", "mi325x", "mi300x", "mi300a", "mi250x", "mi250",
                "mi210", "7900", "9070", "cpu"):
        if key in lower:
            return key
    return re.sub(r"[^a-z0-9]+", "-", lower).strip("-") or "unknown"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def run_meta(device: str, command: str) -> dict:
    """date, device, torch, commit and command of a run made now."""
    return {"date": datetime.date.today().isoformat(), "device": device, "torch": torch.__version__,
            "commit": git_commit(), "command": command}


def data_path(out_dir: str | os.PathLike, bench: str, device: str) -> Path:
    return Path(out_dir) / "data" / f"{bench}-{device_slug(device)}.jsonl"


def read_runs(path: str | os.PathLike) -> list[dict]:
    """The runs of one data file, oldest first ([] if there is none yet); ResultsError for anything malformed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as error:
        raise ResultsError(f"{path}: cannot read: {error}") from None
    runs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            run = json.loads(line)
        except json.JSONDecodeError as error:
            raise ResultsError(f"{path}, line {number}: not JSON ({error})") from None
        if not isinstance(run, dict):
            raise ResultsError(f"{path}, line {number}: a {type(run).__name__}, not a JSON object")
        missing = [key for key in RUN_KEYS if not isinstance(run.get(key), str) or not run[key]]
        if missing:
            raise ResultsError(f"{path}, line {number}: run {run.get('run')!r} has no {', '.join(missing)}")
        runs.append(run)
    return runs


def append_run(out_dir: str | os.PathLike, bench: str, meta: dict, results: list, **extra) -> tuple[Path, dict]:
    """Appends one run (meta: run_meta()'s keys; results: the benchmark's rows; extra: more facts, e.g. a note)
    to <out_dir>/data/<bench>-<device>.jsonl and returns (that path, the run as written). Writers hold the file's
    lock and replace the file atomically, so concurrent benchmarks cannot lose each other's runs and a killed one
    leaves the file as it was; a file that does not read back (ResultsError) is left alone."""
    from filelock import FileLock

    from .files import write_atomically

    path = data_path(out_dir, bench, meta["device"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
        runs = read_runs(path)
        taken = {r["run"] for r in runs}
        name = base = f"{meta['date']}-{bench}-{str(meta['commit'])[:7]}-{device_slug(meta['device'])}"
        suffix = 1
        while name in taken:  # the same benchmark again, same day and commit
            suffix += 1
            name = f"{base}-{suffix}"
        run = {"run": name, "bench": bench, **meta, **extra, "results": results}
        old = path.read_bytes() if path.exists() else b""
        line = json.dumps(run).encode("utf-8") + b"\n"
        write_atomically(path, lambda f: f.write(old + (b"\n" if old and not old.endswith(b"\n") else b"") + line),
                         lock_held=True)
    return path, run
