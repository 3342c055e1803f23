"""VAE decode at SD sizes: eager diffusers vs rocm_sd.optimize(vae) (graph replay) and its flags, wall ms.

    python bench/bench_vae_decode.py [--out-dir bench/results] [--sizes 512,1024] [--flags fuse_resnet,group_norm]

One fp16 AutoencoderKL (the SD VAE architecture, random weights) decodes a batch-1 latent per size; each
engine is warmed up, then timed as the median of 5 synchronized calls (wall time, which for the graphed
rocm_sd decode is the device time plus one launch). Rows "flag=off" optimize with that one flag turned
off, to show what it is worth in the decoder. PSNR against the eager decode of the same latent.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rocm_sd  # noqa: E402
from bench.harness import write_results  # noqa: E402
from rocm_sd import models  # noqa: E402


def decode_ms(vae, latent, repeats: int = 5) -> tuple[float, torch.Tensor]:
    with torch.no_grad():
        image = vae.decode(latent, return_dict=False)[0]  # first call: graph capture for rocm_sd
        vae.decode(latent, return_dict=False)
        samples = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            vae.decode(latent, return_dict=False)
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), image


def psnr(image: torch.Tensor, reference: torch.Tensor) -> float:
    mse = ((image.float() - reference.float()) / 2).pow(2).mean().item()  # images in [-1, 1]
    return 10 * math.log10(1 / mse) if mse else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--sizes", default="512,1024", help="image sizes in pixels (latent = size / 8)")
    parser.add_argument("--flags", default="fuse_resnet,group_norm", help="optimize() flags to turn off one by one")
    args = parser.parse_args()
    vae = models.build_sd_pipeline("sd15", "cuda", torch.float16).vae
    rows, lines = [], ["| size | engine | decode ms | vs eager | PSNR dB |", "|---|---|---:|---:|---:|"]
    for size in (int(s) for s in args.sizes.split(",")):
        latent = torch.randn(1, 4, size // 8, size // 8, device="cuda", dtype=torch.float16)
        eager_ms, reference = decode_ms(vae, latent)
        results = [("eager", eager_ms, float("inf"))]
        for flag in [None] + [f for f in args.flags.split(",") if f]:
            rocm_sd.optimize(vae, **({flag: False} if flag else {}))
            ms, image = decode_ms(vae, latent)
            rocm_sd.revert(vae)
            results.append(("rocm_sd" + (f" {flag}=off" if flag else ""), ms, psnr(image, reference)))
        for engine, ms, db in results:
            rows.append({"size": size, "engine": engine, "decode_ms": round(ms, 2), "psnr_db": round(db, 1)})
            lines.append(f"| {size} | {engine} | {ms:.2f} | {eager_ms / ms:.2f}x | {db:.1f} |")
            print(lines[-1], flush=True)
    print(write_results("vae-decode", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
