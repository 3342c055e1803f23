"""The VAE decode at twelve image sizes in one process, with the convolution library's per-problem search on
(torch.backends.cudnn.benchmark = True: cuDNN's autotuner, NVIDIA's stand-in for MIOpen's find): untiled (diffusers'
decode) against fixed-shape tiles (optimize(vae_tiles=True), rocm_sd/modules/vae_tiles.py).

    python bench/bench_vae_shapes.py [--model sdxl] [--out-dir bench/results] [--optimize]

Each engine runs in a fresh process of its own (cuDNN keeps its search results per process, so one engine's
searches cannot serve the other), after one untimed decode at 256x256 (CUDA's and cuDNN's start-up, a size of its
own). Per size, in order: the first decode (which searches every problem new at that size), the second (which
searches nothing), the ratio, and the convolution problems new at that size and in all so far (counted on a third
decode under a dispatch mode, rocm_sd.prepare.VendorProblems). Then the PSNR of the tiled decode against the untiled
one on the same latent, and the peak memory of one decode at 2048x2048 and 4096x4096. Random weights (the
architecture's VAE config), fp16 (bf16 for the diffusion transformers' VAEs), batch 1.

On ROCm MIOpen keeps its find results on disk: for a cold measurement point MIOPEN_USER_DB_PATH at an empty folder.
Appends the run to bench/results/data/vae-shapes-<device>.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import write_results  # noqa: E402
from rocm_sd import models  # noqa: E402
from rocm_sd.bench import psnr  # noqa: E402

# (width, height): 512 to 2048, square and not, in the order decoded
SIZES = [(512, 512), (512, 768), (768, 512), (768, 768), (832, 1216), (1216, 832), (896, 1152), (1024, 1024),
         (1024, 1536), (1280, 1280), (1536, 1536), (2048, 2048)]
MEMORY_SIZES = [(2048, 2048), (4096, 4096)]
ENGINES = ("untiled", "tiles")


def _vae(model: str):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(**models.ARCHITECTURES[model].vae).to("cuda", models.gpu_dtype(model)).eval()


def _latent(vae, width: int, height: int) -> torch.Tensor:
    generator = torch.Generator("cuda").manual_seed(width * 10007 + height)  # the same latent in every process
    return torch.randn(1, vae.config.latent_channels, height // 8, width // 8, device="cuda", generator=generator,
                       dtype=vae.dtype)


def _psnr(image: torch.Tensor, reference: torch.Tensor) -> float:
    return psnr(((image.float() + 1) / 2).numpy(), ((reference.float() + 1) / 2).numpy())  # decoded in [-1, 1]


def _timed_ms(decode, z) -> tuple[float, torch.Tensor]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    image = decode(z)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3, image


def engine(model: str, name: str, optimize: bool, images_dir: str) -> dict:
    """One engine's sizes, in this process: its rows and peak memory (the untiled engine also saves its images for
    the PSNR, which the tiles' process reads)."""
    import rocm_sd
    from rocm_sd.prepare import VendorProblems

    torch.backends.cudnn.benchmark = True
    vae = _vae(model)
    if optimize or name == "tiles":
        rocm_sd.optimize(vae, **({} if optimize else {flag: False for flag in _flags()}),
                         cuda_graph=False, vae_tiles=name == "tiles")

    def decode(z):
        return vae.decode(z, return_dict=False)[0]

    rows, seen = [], set()
    with torch.no_grad():
        decode(_latent(vae, 256, 256))
        for width, height in SIZES:
            z = _latent(vae, width, height)
            first_ms, image = _timed_ms(decode, z)
            second_ms, _ = _timed_ms(decode, z)
            with (recorder := VendorProblems()):
                decode(z)
            convs = {key for key, kind in recorder.problems.items() if kind == "convolution"}
            row = {"engine": name, "size": f"{width}x{height}", "first_ms": round(first_ms, 1),
                   "second_ms": round(second_ms, 1), "first_over_second": round(first_ms / second_ms, 2),
                   "new_conv_problems": len(convs - seen), "conv_problems_so_far": len(seen | convs)}
            seen |= convs
            path = os.path.join(images_dir, f"{width}x{height}.pt")
            if name == "untiled":
                torch.save(image.cpu(), path)
            else:
                row["psnr_vs_untiled_db"] = round(_psnr(image.cpu(), torch.load(path)), 1)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        for width, height in MEMORY_SIZES:
            torch.cuda.empty_cache()
            try:
                z = _latent(vae, width, height)
                decode(z)  # its searches, whose workspaces are not the decode's memory
                torch.cuda.reset_peak_memory_stats()
                decode(z)
                peak = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            except torch.cuda.OutOfMemoryError:
                peak = "out of memory"
            rows.append({"engine": name, "size": f"{width}x{height}", "peak_gib": peak})
    return {"rows": rows}


def _flags() -> list[str]:
    from rocm_sd.patch.pipeline import FLAG_NAMES

    return [flag for flag in FLAG_NAMES if flag not in ("cuda_graph", "vae_tiles")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--model", default="sdxl", choices=sorted(models.ARCHITECTURES),
                        help="whose VAE config (sd15 / sd21 / sdxl: 4 channels; sd3* / flux*: 16)")
    parser.add_argument("--optimize", action="store_true",
                        help="both engines with rocm_sd.optimize()'s other defaults (kernels, channels_last; no "
                             "graphs)")
    parser.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)  # the child process's
    parser.add_argument("--images", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(2, f"{parser.prog}: no GPU visible to torch {torch.__version__}; this benchmark times a GPU\n")
    if args.engine:
        print(json.dumps(engine(args.model, args.engine, args.optimize, args.images)))
        return

    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as images:
        for name in ENGINES:  # untiled first: the tiles' process reads its images
            command = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--engine", name,
                       "--images", images] + (["--optimize"] if args.optimize else [])
            print("$ " + " ".join(command), flush=True)
            proc = subprocess.run(command, stdout=subprocess.PIPE, text=True)
            if proc.returncode:
                raise SystemExit(f"{name} failed (exit {proc.returncode})")
            rows += json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    for row in rows:
        row.update(model=args.model, optimized=args.optimize)
    lines = ["| engine | size | first ms | second ms | first / second | new conv problems | conv problems so far "
             "| PSNR vs untiled dB |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['engine']} | {r['size']} | {r['first_ms']} | {r['second_ms']} | {r['first_over_second']} | "
              f"{r['new_conv_problems']} | {r['conv_problems_so_far']} | {r.get('psnr_vs_untiled_db', '-')} |"
              for r in rows if "first_ms" in r]
    lines += ["", "| engine | size | peak GiB |", "|---|---|---:|"]
    lines += [f"| {r['engine']} | {r['size']} | {r['peak_gib']} |" for r in rows if "peak_gib" in r]
    print(write_results("vae-shapes", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
