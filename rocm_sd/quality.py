"""`python -m rocm_sd quality`: how far a mode of optimize() (precision='fp8' / 'int8', attention_precision='fp8',
cache='deepcache' / 'adaptive' / 'fbcache' / 'teacache') moves the images from the reference, rocm_sd.optimize(pipe) with its defaults (fp16).

One pipeline, built once. N prompts (PROMPTS, in turn), image i from seed `seed + i`: first every image with the
reference, then, after revert, every image with the mode. Per image: PSNR and SSIM against the reference image,
the time of each pipeline call, and whether latents and image are finite; then the mean and the worst. Prints the
table and writes <out>/<model>-<mode>.{json,md,png}: the numbers, the table, and a grid with one row per prompt
(reference | mode | amplified difference). docs/quality.md says how to read them.

A mode that optimize() could not apply here (no FP8 on the device, a CPU) is said so, and its column is named for
what ran: the reference again, so PSNR inf and SSIM 1 are measured, not pretended.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from . import cli_args, models, patch, platform
from .bench import device_name, git_commit, mode_text, optimize_with_options, psnr
from .patch import pipeline, step_cache
from .quality_prompts import PROMPTS

THRESHOLD_MODES = ("adaptive", "fbcache", "teacache")  # the cache modes that take --cache-threshold

DIFF_GAIN = 10     # the grid's difference column: |reference - mode| times this, clipped to white
GRID_CELL_MAX = 512  # larger images are shrunk to this in the grid (the numbers are from the full images)
# SSIM as Wang, Bovik, Sheikh, Simoncelli (2004): Gaussian window 11x11, sigma 1.5, K1 0.01, K2 0.03.
SSIM_WINDOW, SSIM_SIGMA, SSIM_K1, SSIM_K2 = 11, 1.5, 0.01, 0.03
RANDOM_WEIGHTS_NOTE = (
    "Random weights: {model} is the architecture built from its config, not a trained model. These numbers are the "
    "mode's numerical error carried through the real architecture, sampler and VAE, against fp16 on the same weights "
    "and seeds: a proxy. They do not show the image quality of trained weights, whose activations and images differ "
    "(random weights make noise-like images). Run this command with --model on your own diffusers model folder for "
    "that.")


def ssim(a, b, data_range: float = 1.0) -> float:
    """Mean SSIM of two images (H, W) or (H, W, C), numpy arrays or tensors, values in [0, data_range]: Wang et al.
    2004's index with an 11x11 Gaussian window (sigma 1.5), K1 = 0.01, K2 = 0.03, local statistics weighted by the
    window (no sample-covariance correction), computed in float64 at every position where the window fits (no
    padding, no downsampling), averaged over positions and channels. 1.0 for identical images; NaN if either has
    NaN."""
    x = torch.as_tensor(np.asarray(a), dtype=torch.float64)
    y = torch.as_tensor(np.asarray(b), dtype=torch.float64)
    if x.shape != y.shape or x.dim() not in (2, 3):
        raise ValueError(f"ssim: two images of one shape (H, W) or (H, W, C), got {tuple(x.shape)} and {tuple(y.shape)}")
    if min(x.shape[:2]) < SSIM_WINDOW:
        raise ValueError(f"ssim: images of at least {SSIM_WINDOW}x{SSIM_WINDOW} pixels, got {tuple(x.shape[:2])}")
    x, y = (t.reshape(*t.shape[:2], -1).permute(2, 0, 1).unsqueeze(1) for t in (x, y))  # (C, 1, H, W)
    taps = torch.arange(SSIM_WINDOW, dtype=torch.float64) - (SSIM_WINDOW - 1) / 2
    g = torch.exp(-taps ** 2 / (2 * SSIM_SIGMA ** 2))
    g = g / g.sum()

    def mean(t):  # the Gaussian-weighted mean over each window position (separable: rows, then columns)
        return F.conv2d(F.conv2d(t, g.view(1, 1, 1, -1)), g.view(1, 1, -1, 1))

    mx, my = mean(x), mean(y)
    vx, vy, cxy = mean(x * x) - mx * mx, mean(y * y) - my * my, mean(x * y) - mx * my
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    index = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(index.mean())


def mode_options(precision: str | None = None, cache: str | None = None, cache_interval: int | None = None,
                 cache_threshold: float | None = None, cache_branch: int | None = None,
                 precision_layers: str | None = None, attention_precision: str | None = None,
                 precision_convs: bool | None = None) -> dict:
    """optimize()'s options for a mode, only those that differ from the reference; cli_args.UsageError for none or
    for a cache setting without its cache mode."""
    if cache_interval is not None and cache != "deepcache":
        raise cli_args.UsageError("argument --cache-interval: applies to --cache deepcache only")
    if cache_threshold is not None and cache not in THRESHOLD_MODES:
        raise cli_args.UsageError(f"argument --cache-threshold: applies to --cache {', '.join(THRESHOLD_MODES)} only")
    if cache_branch is not None and cache not in ("deepcache", "adaptive"):
        raise cli_args.UsageError("argument --cache-branch: applies with --cache deepcache or adaptive only")
    if precision_layers is not None and precision is None:
        raise cli_args.UsageError("argument --precision-layers: applies with --precision only")
    if precision_convs is not None and precision != "fp8":
        raise cli_args.UsageError("argument --precision-convs: applies with --precision fp8 only")
    defaults = {option.name: option.default for option in pipeline.OPTIONS}
    options = {"precision": precision, "precision_layers": precision_layers, "attention_precision": attention_precision,
               "cache": cache, "cache_interval": cache_interval, "cache_threshold": cache_threshold,
               "cache_branch": cache_branch, "precision_convs": precision_convs}
    options = {k: v for k, v in options.items() if v is not None and v != defaults[k]}
    if not ({"precision", "attention_precision", "cache"} & options.keys()):
        raise cli_args.UsageError("nothing to compare with the reference (fp16, no cache): give --precision, "
                                  "--attention-precision and/or --cache")
    if options.get("cache") == "deepcache":
        options.setdefault("cache_interval", defaults["cache_interval"])
    if options.get("cache") == "adaptive":
        options.setdefault("cache_threshold", step_cache.ADAPTIVE_THRESHOLD)
    return options


def cache_mode_problem(cache: str | None, model: str) -> str | None:
    """Why cache mode `cache` cannot apply to the architecture `model` (a UNet mode on a diffusion transformer, or the
    other way round), or None (also for a model folder: optimize() says so when it loads)."""
    if cache is None or model not in models.ARCHITECTURES:
        return None
    transformer = models.is_transformer(model)
    why = step_cache.other_kind(cache, transformer)
    return f"{why}, and {model} is {'a diffusion transformer' if transformer else 'a UNet model'}" if why else None


def mode_slug(options: dict) -> str:
    """'fp8', 'fp8all' (precision_layers "all"), 'fp8noconv' (precision_convs False), 'attentionfp8', 'deepcache3',
    'int8-adaptive0.15', 'deepcache3-branch1', 'fbcache' (its default threshold), 'teacache0.2': a file name part."""
    noconv = "noconv" if options.get("precision_convs") is False else ""
    parts = [options["precision"] + options.get("precision_layers", "") + noconv] if "precision" in options else []
    if "attention_precision" in options:
        parts.append(f"attention{options['attention_precision']}")
    if options.get("cache") == "deepcache":
        parts.append(f"deepcache{options['cache_interval']}")
    elif options.get("cache") in THRESHOLD_MODES:  # a transformer mode's default threshold depends on the model
        parts.append(options["cache"] + (f"{options['cache_threshold']:g}" if "cache_threshold" in options else ""))
    if "cache_branch" in options:
        parts.append(f"branch{options['cache_branch']}")
    return "-".join(parts)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _generate(pipe, prompt: str, seed: int, steps: int, size: int | None, device: torch.device):
    """One image: (seconds, image (H, W, 3) float in [0, 1], final latents)."""
    final = {}

    def keep_latents(_pipe, _step, _t, kwargs):
        final["latents"] = kwargs["latents"]
        return kwargs

    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        image = pipe(**models.conditioning(pipe, [prompt]), num_inference_steps=steps,
                     generator=torch.Generator(device).manual_seed(seed), height=size, width=size, output_type="np",
                     callback_on_step_end=keep_latents, callback_on_step_end_tensor_inputs=["latents"]).images[0]
    _sync(device)
    return time.perf_counter() - start, np.asarray(image, dtype=np.float32), final["latents"]


def _finite(image: np.ndarray, latents: torch.Tensor) -> str:
    bad = [what for what, ok in (("latents", bool(torch.isfinite(latents).all())),
                                 ("image", bool(np.isfinite(image).all()))) if not ok]
    return "ok" if not bad else "NaN/Inf in " + " and ".join(bad)


def _phase(pipe, prompts: list[str], seed: int, steps: int, size: int | None, device: torch.device, what: str):
    """Every prompt once after one untimed warm-up call (graph capture, kernel choice): [(s, image, finite)]."""
    print(f"  {what}: warm-up call, then {len(prompts)} images", flush=True)
    _generate(pipe, prompts[0], seed, steps, size, device)
    out = []
    for i, prompt in enumerate(prompts):
        seconds, image, latents = _generate(pipe, prompt, seed + i, steps, size, device)
        out.append((seconds, image, _finite(image, latents)))
    return out


def _number(value: float, digits: int) -> str:
    return "nan" if math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.{digits}f}")


def _ssim_text(value: float) -> str:
    """4 decimals, more where that would round a near-identical image to 1; '1' only for an SSIM of exactly 1."""
    if math.isnan(value) or value == 1.0:
        return _number(value, 0)
    return f"{value:.{min(9, max(4, 1 + math.ceil(-math.log10(abs(1 - value)))))}f}"


def _worst(values: list[float], pick) -> float:
    """pick (min / max) of the values, NaN if any is NaN (a NaN image is the worst there is)."""
    return math.nan if any(math.isnan(v) for v in values) else pick(values)


def table(result: dict) -> str:
    mode = result["mode_column"]
    lines = [f"| # | prompt | seed | PSNR dB | SSIM | reference s | {mode} s | finite: reference / {mode} |",
             "|---:|---|---:|---:|---:|---:|---:|---|"]
    for i, r in enumerate(result["images"]):
        lines.append(f"| {i} | {r['prompt']} | {r['seed']} | {_number(r['psnr_db'], 2)} | {_ssim_text(r['ssim'])} | "
                     f"{r['reference_s']:.3f} | {r['mode_s']:.3f} | {r['reference_finite']} / {r['mode_finite']} |")
    for name, row in (("mean", result["mean"]), ("worst", result["worst"])):
        lines.append(f"| {name} | | | {_number(row['psnr_db'], 2)} | {_ssim_text(row['ssim'])} | "
                     f"{row['reference_s']:.3f} | {row['mode_s']:.3f} | {row['finite']} |")
    return "\n".join(lines)


def _notes(result: dict) -> list[str]:
    notes = []
    if not result["applied"]:
        notes.append(f"{result['mode']}: {result['not_applied']}")
    mean = result["mean"]
    notes.append(f"Speed: {result['mode_column']} took {mean['mode_s']:.3f} s an image against the reference's "
                 f"{mean['reference_s']:.3f} s ({mean['reference_s'] / mean['mode_s']:.2f}x), one pipeline call an "
                 f"image after one untimed warm-up call per column, {result['steps']} steps, on {result['device']}"
                 + (" (a CPU: ops run PyTorch's code, so these times say nothing of GPU speed)"
                    if result["device"] == "cpu" else "") + ".")
    notes.append("Worst: the lowest PSNR and SSIM, the slowest image of each column, and how many images had NaN/Inf "
                 "in their final latents or image.")
    if result["random_weights"]:
        notes.append(RANDOM_WEIGHTS_NOTE.format(model=result["model"]))
    return notes


def grid(reference: list[np.ndarray], mode: list[np.ndarray], labels: list[str], columns: tuple[str, str],
         path: str) -> None:
    """reference | mode | |difference| x DIFF_GAIN, one row per image, with a header and a label above each row."""
    from PIL import Image, ImageDraw

    def to_pil(image: np.ndarray) -> Image.Image:
        pil = Image.fromarray((np.nan_to_num(np.clip(image, 0, 1)) * 255).round().astype(np.uint8))
        if max(pil.size) > GRID_CELL_MAX:
            scale = GRID_CELL_MAX / max(pil.size)
            pil = pil.resize((max(1, round(pil.width * scale)), max(1, round(pil.height * scale))), Image.LANCZOS)
        return pil

    cells = [[to_pil(a), to_pil(b), to_pil(np.abs(a.astype(np.float64) - b) * DIFF_GAIN)]
             for a, b in zip(reference, mode)]
    cell_w, cell_h = cells[0][0].size
    pad, text_h = 4, 14
    width = max(3 * cell_w + 4 * pad, 480)
    canvas = Image.new("RGB", (width, text_h + pad + len(cells) * (text_h + cell_h + pad) + pad), "white")
    draw = ImageDraw.Draw(canvas)
    for j, title in enumerate((*columns, f"|difference| x{DIFF_GAIN}")):
        draw.text((pad + j * (cell_w + pad), pad), title, fill="black")
    y = text_h + pad
    for row, label in zip(cells, labels):
        draw.text((pad, y), label, fill="black")
        for j, cell in enumerate(row):
            canvas.paste(cell, (pad + j * (cell_w + pad), y + text_h))
        y += text_h + cell_h + pad
    canvas.save(path, format="PNG")


def run(model: str | None = None, precision: str | None = None, cache: str | None = None,
        cache_interval: int | None = None, cache_threshold: float | None = None, cache_branch: int | None = None,
        precision_layers: str | None = None, attention_precision: str | None = None,
        precision_convs: bool | None = None, prompts: int = 4, steps: int = 20, size: int | None = None, seed: int = 0,
        device: str | torch.device | None = None, out_dir: str = "rocm_sd_quality") -> dict:
    """The command; returns what it writes to the JSON file."""
    options = mode_options(precision, cache, cache_interval, cache_threshold, cache_branch, precision_layers,
                           attention_precision, precision_convs)
    device = torch.device(device or ("cuda" if platform.gpu_available() else "cpu"))
    model = model or ("sd15" if device.type == "cuda" else "tiny")
    why = cache_mode_problem(cache, model)
    if why:
        raise cli_args.UsageError(f"argument --cache: {why}")
    dtype = models.gpu_dtype(model) if device.type == "cuda" else torch.float32
    random_weights = model in models.ARCHITECTURES
    size = size or (models.default_size(model) if random_weights else None)  # None: the pipeline's own default
    texts = [PROMPTS[i % len(PROMPTS)] for i in range(prompts)]
    mode = mode_text(options)
    print(f"rocm_sd quality: {model}{' (random weights)' if random_weights else ''}, {dtype}, "
          f"{f'{size}x{size}, ' if size else ''}{steps} steps, {prompts} prompts, on {device_name(device)}; "
          f"reference: optimize()'s defaults (precision fp16: the model's own dtype; no cache); mode: {mode}",
          flush=True)

    pipe = models.load_pipeline(model, device, dtype)
    patch.optimize(pipe)
    reference = _phase(pipe, texts, seed, steps, size, device, "reference")
    patch.revert(pipe)
    skipped = optimize_with_options(pipe, options)
    name = mode_slug(options)
    not_applied = None
    if skipped:
        why = "; ".join(skipped)
        not_applied = (f"not applied on {device_name(device)} ({why}): ran as the reference (fp16), so its column "
                       "measures the reference again")
        print(f"note: {mode}: {not_applied}", flush=True)
        name = f"{name} (not applied)"
    try:
        moded = _phase(pipe, texts, seed, steps, size, device, name)
        report = patch.report(pipe)
    finally:
        patch.revert(pipe)

    images = []
    for i, (text, (ref_s, ref_image, ref_ok), (mode_s, mode_image, mode_ok)) in enumerate(zip(texts, reference, moded)):
        images.append({"prompt": text, "seed": seed + i, "psnr_db": psnr(ref_image, mode_image),
                       "ssim": ssim(ref_image, mode_image), "reference_s": ref_s, "mode_s": mode_s,
                       "reference_finite": ref_ok, "mode_finite": mode_ok})
    bad = sum(r["reference_finite"] != "ok" for r in images), sum(r["mode_finite"] != "ok" for r in images)
    column = {k: [r[k] for r in images] for k in ("psnr_db", "ssim", "reference_s", "mode_s")}
    result = {
        "model": model, "random_weights": random_weights, "device": device_name(device),
        "dtype": str(dtype).removeprefix("torch."), "steps": steps,
        "size": list(reference[0][1].shape[:2]), "seed": seed, "mode": mode, "options": options, "applied": not skipped,
        "not_applied": not_applied, "mode_column": name,
        "images": images,
        "mean": {k: statistics.fmean(v) for k, v in column.items()} | {"finite": ""},
        "worst": {"psnr_db": _worst(column["psnr_db"], min), "ssim": _worst(column["ssim"], min),
                  "reference_s": max(column["reference_s"]), "mode_s": max(column["mode_s"]),
                  "finite": f"{bad[0]} / {bad[1]} with NaN/Inf"},
        "report": report, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
        "commit": git_commit(),
    }
    text = table(result)
    notes = _notes(result)
    print()
    print(text)
    print()
    for note in notes:
        print(note)

    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{os.path.basename(os.path.normpath(model))}-{mode_slug(options)}")
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    heading = (f"# {model}: {mode} against the reference (optimize()'s defaults: precision fp16, no cache)\n\n"
               f"{result['device']}, {result['dtype']}, {result['size'][1]}x{result['size'][0]}, {steps} steps, "
               f"seeds {seed}-{seed + prompts - 1}, commit {result['commit'][:7]}, {result['date']}.\n\n")
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(heading + text + "\n\n" + "\n\n".join(notes) + "\n")
    grid([r[1] for r in reference], [m[1] for m in moded],
         [f"#{i} seed {r['seed']}: PSNR {_number(r['psnr_db'], 1)} dB, SSIM {_ssim_text(r['ssim'])}"
          for i, r in enumerate(images)], ("reference (fp16)", name), stem + ".png")
    print(f"wrote {stem}.json, {stem}.md, {stem}.png")
    return result
