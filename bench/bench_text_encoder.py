"""Prompt encoding (the CLIP text encoders) at SD1.5 and SDXL: eager transformers vs rocm_sd.optimize, wall ms.

    python bench/bench_text_encoder.py [--out-dir bench/results] [--archs sd15,sdxl]

What a pipeline pays per image before its first UNet step: the prompt and the negative prompt, each one
batch-1 call of every text encoder (SDXL: both, with hidden states), as diffusers' encode_prompt does.
fp16, random weights (the released models' shapes), 77 tokens. Median of 20 synchronized encodings after
warm-up; rows: eager, rocm_sd (LayerNorm kernel + graphed forward), rocm_sd with cuda_graph=False (what
the kernels alone are worth). Max abs difference of the conditioning tensors against eager.
"""
from __future__ import annotations

import argparse
import os
import sys
import types

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rocm_sd  # noqa: E402
from bench.harness import wall_ms, write_results  # noqa: E402
from rocm_sd import models  # noqa: E402

PROMPT, NEGATIVE = "a lighthouse on a cliff at dawn, oil painting", "blurry"


def text_encoders(arch: str):
    """Only the pipeline's text encoders (building the UNet would cost minutes of CPU here)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    spec = models.ARCHITECTURES[arch]
    torch.manual_seed(0)
    encoders = {"text_encoder": CLIPTextModel(CLIPTextConfig(**spec.text)), "text_encoder_2": None}
    if getattr(spec, "text_2", None):
        encoders["text_encoder_2"] = CLIPTextModelWithProjection(CLIPTextConfig(**spec.text_2))
    for model in filter(None, encoders.values()):
        model.to("cuda", torch.float16).eval()
    return types.SimpleNamespace(**encoders)


def encode_ms(pipe, repeats: int = 20) -> tuple[float, dict]:
    with torch.no_grad():
        out = models.prompt_kwargs(pipe, PROMPT, NEGATIVE)  # first call: graph capture for rocm_sd
        ms, _ = wall_ms(lambda: models.prompt_kwargs(pipe, PROMPT, NEGATIVE), repeats)
    return ms, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--archs", default="sd15,sdxl")
    args = parser.parse_args()
    rows, lines = [], ["| model | engine | encode ms (prompt + negative) | vs eager | max abs diff | report |",
                       "|---|---|---:|---:|---:|---|"]
    for arch in args.archs.split(","):
        pipe = text_encoders(arch)
        eager_ms, reference = encode_ms(pipe)
        results = [("eager", eager_ms, 0.0, "")]
        for flags in ({}, {"cuda_graph": False}):
            rocm_sd.optimize(pipe, **flags)
            ms, out = encode_ms(pipe)
            report = rocm_sd.report(pipe)["text_encoder"]
            rocm_sd.revert(pipe)
            diff = max((out[k].float() - reference[k].float()).abs().max().item() for k in reference)
            summary = ", ".join(f"{k} {v}" for k, v in sorted(report.items()) if not k.startswith("graphed"))
            results.append(("rocm_sd" + "".join(f" {k}={v}" for k, v in flags.items()), ms, diff, summary))
        for engine, ms, diff, summary in results:
            rows.append({"model": arch, "engine": engine, "encode_ms": round(ms, 3), "max_abs_diff": diff,
                         "report_text_encoder": summary})
            lines.append(f"| {arch} | {engine} | {ms:.2f} | {eager_ms / ms:.2f}x | {diff:.1e} | {summary} |")
            print(lines[-1], flush=True)
        del pipe
        torch.cuda.empty_cache()
    print(write_results("text-encoder", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
