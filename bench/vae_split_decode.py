"""One torchrun job of bench_parallel.py's vae-split rows: the VAE decode of one image on every rank (what each rank
of an image's group runs with --vae-split off) against the decode split in bands over the ranks (on).

    torchrun --nproc-per-node 2 bench/vae_split_decode.py --model sdxl --sizes 1024,2048 --out rows.json

Every rank builds the architecture's VAE (random weights, the same seed) and the same latent, optimized on a GPU
(rocm_sd.optimize: kernels and graph replay of the whole decode), in the float32 of a CPU otherwise (gloo: what
tests/test_parallel_vae_split.py runs). Wall ms of a call, the median of --repeats after a warm-up, each call
started together (a barrier) and ended on the host (synchronized); PSNR of the split image against the whole one.
Rank 0 writes the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.bench_vae_decode import psnr  # noqa: E402
from rocm_sd import models, optimize  # noqa: E402
from rocm_sd.parallel.mesh import init  # noqa: E402
from rocm_sd.parallel.vae_split import VaeSplit, plan  # noqa: E402


def wall_ms(fn, device: torch.device, repeats: int) -> tuple[float, torch.Tensor]:
    def synchronized():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    out = fn()  # warm-up: graph capture, convolution algorithm choice
    samples = []
    for _ in range(repeats):
        synchronized()
        dist.barrier()
        start = time.perf_counter()
        fn()
        synchronized()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sdxl", choices=sorted(models.ARCHITECTURES))
    parser.add_argument("--sizes", default="1024,2048", help="image sides in pixels")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", required=True, help="JSON file of the rows (rank 0)")
    args = parser.parse_args()
    from diffusers import AutoencoderKL

    mesh = init("seq")  # every rank one image's: the split's group (2 processes or more)
    on_gpu = mesh.device.type == "cuda"
    dtype = models.gpu_dtype(args.model) if on_gpu else torch.float32
    torch.manual_seed(0)
    vae = AutoencoderKL(**models.ARCHITECTURES[args.model].vae).to(mesh.device, dtype).eval()
    if on_gpu:
        optimize(vae)
    scale = 2 ** (len(vae.config.block_out_channels) - 1)
    split = VaeSplit(vae, vae.decode, dist.group.WORLD, mode="on")
    rows = []
    with torch.inference_mode():
        for size in (int(s) for s in args.sizes.split(",")):
            z = torch.randn(1, vae.config.latent_channels, size // scale, size // scale, device=mesh.device,
                            generator=torch.Generator(mesh.device).manual_seed(1)).to(dtype)
            whole_ms, whole = wall_ms(lambda: vae.decode(z, return_dict=False)[0], mesh.device, args.repeats)
            split_ms, image = wall_ms(lambda: split(z, return_dict=False)[0], mesh.device, args.repeats)
            pieces = plan(1, *z.shape[-2:], mesh.world)
            rows.append({"model": args.model, "size": size, "gpus": mesh.world,
                         "dtype": str(dtype).removeprefix("torch."),
                         "bands": len(pieces.tiles.rows) if pieces else 1,
                         "band_rows": pieces.tiles.side_y if pieces else z.shape[-2], "latent_rows": z.shape[-2],
                         "whole_ms": round(whole_ms, 2), "split_ms": round(split_ms, 2),
                         "split_vs_whole": round(split_ms / whole_ms, 3), "psnr_db": round(psnr(image, whole), 1),
                         "stats": dict(split.stats)})
            split.stats.clear()
    if mesh.rank == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
