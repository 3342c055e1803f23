"""Every optimize() mode at every resolution from 512 to 1024: are the latents and the image finite, and how far is the
image from fp16's? One random-weight pipeline per model, one seeded generation per (resolution, mode), default flags
(graphs on), the modes one after another on the same pipeline (revert() between them).

    python bench/modes_sweep.py [models] [sizes] [steps] [modes]
    python bench/modes_sweep.py sd15,sd21,sdxl 512,768,1024 10 fp16,fp8,fp8all,int8all,deepcache,adaptive

Modes: those of `python -m rocm_sd bench` (fp8, int8, deepcache: interval 3, adaptive: threshold 0.15, attnfp8), and
'fp8all' / 'int8all': precision_layers="all" (every layer 8-bit; with the shipped Hopper measurements int8 keeps every
layer in fp16, so plain 'int8' would test fp16). PSNR is against the fp16 image of the same model and resolution
(random weights: how far a mode's error carries, not image quality). Prints a markdown table, a row per run.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch

import rocm_sd
from rocm_sd import bench, models

# `python -m rocm_sd bench`'s modes without their "rocm_sd-" prefix, and every layer 8-bit
MODES = {"fp16": {}, **{name.removeprefix("rocm_sd-"): options for name, options in bench.MODES.items()},
         "fp8all": {"precision": "fp8", "precision_layers": "all"},
         "int8all": {"precision": "int8", "precision_layers": "all"}}


def generate(pipe, kw, size: int, steps: int) -> tuple[torch.Tensor, np.ndarray]:
    """(latents, image) of one seeded generation: the denoising loop's last latents (taken by a step-end callback, as
    the pipeline hands them to its VAE) and the pipeline's image."""
    last = {}

    def keep(pipeline, step, timestep, tensors):
        last["latents"] = tensors["latents"].clone()
        return tensors

    with torch.no_grad():
        image = pipe(**kw, num_inference_steps=steps, height=size, width=size, output_type="np",
                     generator=torch.Generator("cuda").manual_seed(0), callback_on_step_end=keep,
                     callback_on_step_end_tensor_inputs=["latents"]).images
    torch.cuda.synchronize()
    return last["latents"], image


def main(model_names: list[str], sizes: list[int], steps: int, modes: list[str]) -> None:
    print(f"steps {steps}; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| model | size | mode | latents finite | image finite | PSNR dB vs fp16 | first call s | not applied |")
    print("|---|---:|---|---|---|---:|---:|---|")
    failures = 0
    for model in model_names:
        pipe = models.build_sd_pipeline(model, "cuda", torch.float16)
        kw = models.prompt_kwargs(pipe, "a watercolor painting of a lighthouse at dawn")
        for size in sizes:
            reference = None
            for mode in modes:
                not_applied = "; ".join(bench.optimize_with_options(pipe, MODES[mode])) or "-"
                start = time.perf_counter()
                latents, image = generate(pipe, kw, size, steps)
                seconds = time.perf_counter() - start
                rocm_sd.revert(pipe)
                reference = image if mode == "fp16" else reference
                finite_latents, finite_image = bool(torch.isfinite(latents).all()), bool(np.isfinite(image).all())
                failures += not (finite_latents and finite_image)
                db = "-" if mode == "fp16" or reference is None else f"{bench.psnr(image, reference):.1f}"
                print(f"| {model} | {size} | {mode} | {finite_latents} | {finite_image} | {db} | {seconds:.1f} | "
                      f"{not_applied} |", flush=True)
        del pipe
        torch.cuda.empty_cache()
    print(f"{failures} run(s) with NaN or Inf")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: no GPU visible to torch {torch.__version__}; this runs the pipelines on a GPU")
    args = sys.argv[1:] + [None] * 4
    chosen = (args[3] or "fp16,fp8,fp8all,int8all,deepcache,adaptive").split(",")
    unknown = [m for m in chosen if m not in MODES]
    if unknown or (chosen and chosen[0] != "fp16"):
        sys.exit(f"{sys.argv[0]}: modes must start with fp16 (the reference) and be among {', '.join(MODES)}; "
                 f"got {','.join(chosen)}")
    try:
        names = (args[0] or "sd15,sd21,sdxl").split(",")
        size_list = [int(s) for s in (args[1] or "512,768,1024").split(",")]
        step_count = int(args[2] or 10)
    except ValueError as error:
        sys.exit(f"{sys.argv[0]}: sizes and steps must be integers ({error})")
    main(names, size_list, step_count, chosen)
