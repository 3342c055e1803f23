"""Multi-GPU throughput, CFG-, sequence- and patch-parallel latency of `rocm_sd generate`, each configuration one
torchrun job.

    python bench/bench_parallel.py [--gpus 1,2,4] [--prompts 32] [--batch 4] [--latency-model sd15 sdxl]
                                   [--seq-model flux sd35] [--seq-gpus 2,4]
                                   [--patch-model sd15 sdxl] [--patch-gpus 2,4] [--patch-warmup 1]
                                   [--vae-split-model sdxl flux] [--vae-split-sizes 1024,2048] [--vae-split-gpus 2,4]

Throughput: --prompts prompts (SD1.5 512x512, 50 steps by default) in data-parallel mode on each GPU count;
images/s over the generation phase (after each rank's warm-up, which captures the graphs), and whether
every image equals the one-GPU image. Latency: one image at a time (batch 1), one GPU in data mode against
two GPUs in cfg mode, with the VAE decode whole on each (--vae-split off) and in bands over the pair (on); median
seconds per image, and PSNR of the cfg images against the one-GPU ones. Sequence
parallelism (--seq-model, none by default): the diffusion transformers at 1024x1024, one image at a time, one GPU
against seq mode on each of --seq-gpus (where the heads divide) and, for SD3 / SD3.5, cfg-seq mode (2 x N/2).
Patch parallelism (--patch-model, none by default): the UNets at their LATENCY size, one GPU against patch mode
(DistriFusion, --patch-warmup synchronous steps per image) on each of --patch-gpus, PSNR against the one-GPU images.
The VAE decode split (--vae-split-model): one image's decode alone, whole on every rank against split in bands over
--vae-split-gpus, each GPU count one torchrun job of bench/vae_split_decode.py (ms, PSNR of the split image).
Appends the run to bench/results/data/parallel-<device>.jsonl (rows as docs/performance.md asks; the one-GPU
latency rows also carry the device-time bounds: unet_b2_ms, unet_b1_ms, vae_decode_b1_ms).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import write_results  # noqa: E402
from rocm_sd.bench import psnr  # noqa: E402

SUBJECTS = ["a lighthouse", "a red fox", "snowy mountains", "a bowl of fruit", "a city street", "an old ship",
            "a forest path", "a desert town"]
STYLES = ["at dawn, watercolor", "in the rain, oil painting", "at night, photograph", "in autumn, ink drawing"]
LATENCY = {"sd15": dict(steps=50, size=512, prompts=5), "sdxl": dict(steps=30, size=1024, prompts=3)}
SEQ_MODELS = ("flux", "flux-schnell", "sd3", "sd35m", "sd35")
VAE_SPLIT_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vae_split_decode.py")


def prompts(n: int) -> list[str]:
    return [f"{SUBJECTS[i % len(SUBJECTS)]} {STYLES[(i // len(SUBJECTS)) % len(STYLES)]}, variant {i}"
            for i in range(n)]


def generate(workdir: str, name: str, gpus: int, prompt_list: list[str], *args: str) -> tuple[dict, list]:
    """One torchrun job; its run.json and images."""
    from PIL import Image

    path = os.path.join(workdir, f"{name}.txt")
    with open(path, "w") as f:
        f.write("\n".join(prompt_list) + "\n")
    out = os.path.join(workdir, name)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", "-m", "rocm_sd",
           "generate", "--prompts", path, "--out", out, *args]
    print("$ " + " ".join(cmd), flush=True)
    # torchrun gives several processes one CPU thread each and one process all: the same for every row.
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "4"})
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "", flush=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
    with open(os.path.join(out, "run.json")) as f:
        run = json.load(f)
    return run, [np.asarray(Image.open(os.path.join(out, n))) for n in run["images"]]


def split_bound(model: str, size: int, repeats: int = 20) -> dict:
    """What CFG-parallel can gain at best, on one GPU: the optimized UNet step (graph replay) on the half
    batch against the whole CFG batch, and the VAE decode of one image, which both ranks of a pair run."""
    import statistics

    import torch

    from rocm_sd import models, optimize

    pipe = optimize(models.build_sd_pipeline(model, "cuda", torch.float16))
    unet, h = pipe.unet, size // 8
    ctx_dim = unet.config.cross_attention_dim

    def inputs(n):
        kw = {"encoder_hidden_states": torch.randn(n, 77, ctx_dim, device="cuda", dtype=torch.float16)}
        if unet.config.addition_embed_type == "text_time":
            kw["added_cond_kwargs"] = {"text_embeds": torch.randn(n, 1280, device="cuda", dtype=torch.float16),
                                       "time_ids": torch.randn(n, 6, device="cuda", dtype=torch.float16)}
        return (torch.randn(n, 4, h, h, device="cuda", dtype=torch.float16), torch.tensor(500.0, device="cuda")), kw

    def median_ms(fn):
        for _ in range(3):
            fn()
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples)

    out = {}
    with torch.inference_mode():
        for n in (1, 2):
            args, kw = inputs(n)
            out[f"unet_b{n}_ms"] = median_ms(lambda: unet(*args, **kw, return_dict=False))
        latents = torch.randn(1, 4, h, h, device="cuda", dtype=torch.float16)
        out["vae_decode_b1_ms"] = median_ms(lambda: pipe.vae.decode(latents, return_dict=False))
    del pipe
    torch.cuda.empty_cache()
    return out


def seq_modes(model: str, gpus: int) -> list[str]:
    """The token-splitting modes `model` can run on `gpus` GPUs: its heads divide over the GPUs of a split."""
    from rocm_sd.dit_models import ARCHITECTURES

    spec = ARCHITECTURES[model]
    heads = spec.transformer["num_attention_heads"]
    cfg = spec.family == "sd3" and spec.guidance > 1
    return ([] if heads % gpus else ["seq"]) + (["cfg-seq"] if cfg and gpus >= 4 and gpus % 2 == 0
                                                and heads % (gpus // 2) == 0 else [])


def seq_latency(work: str, model: str, gpu_counts: list[int], rows: list, lines: list) -> None:
    """One GPU against the token-splitting modes, one image at a time; rows and table lines appended."""
    from rocm_sd.dit_models import ARCHITECTURES

    spec = ARCHITECTURES[model]
    lat = ["--model", model, "--height", "1024", "--width", "1024", "--steps", str(spec.steps), "--batch", "1",
           "--guidance", str(spec.guidance)]
    split_latency(work, model, 1024, spec.steps, lat, [(gpus, mode) for gpus in gpu_counts
                                                        for mode in seq_modes(model, gpus)], rows, lines)


def patch_latency(work: str, model: str, gpu_counts: list[int], warmup: int, rows: list, lines: list) -> None:
    """One GPU against patch mode (DistriFusion) on each GPU count, one image at a time; rows and lines appended."""
    spec = LATENCY[model]
    lat = ["--model", model, "--height", str(spec["size"]), "--width", str(spec["size"]), "--steps",
           str(spec["steps"]), "--batch", "1"]
    split_latency(work, model, spec["size"], spec["steps"], lat, [(gpus, "patch") for gpus in gpu_counts], rows,
                  lines, ("--patch-warmup", str(warmup)))


def split_latency(work: str, model: str, size: int, steps: int, lat: list[str], splits: list[tuple[int, str]],
                  rows: list, lines: list, extra: tuple[str, ...] = ()) -> None:
    """One GPU against each (GPU count, mode) of `splits`, 3 images one at a time (`lat`: generate's arguments,
    `extra`: the split runs' own); rows and table lines appended, PSNR the lowest of the 3 against one GPU's."""
    single, ref = generate(work, f"one-{model}", 1, prompts(3), *lat)
    s1 = single["timings"]["median_round_s"]
    runs = [(1, "data", s1, None)]
    for gpus, mode in splits:
        run, got = generate(work, f"{mode}{gpus}-{model}", gpus, prompts(3), *lat, "--mode", mode, *extra)
        runs.append((gpus, mode, run["timings"]["median_round_s"],
                     min(psnr(a / 255.0, b / 255.0) for a, b in zip(ref, got))))
    for gpus, mode, s, quality in runs:
        rows.append({"gpus": gpus, "mode": mode, "model": model, "height": size, "width": size, "steps": steps,
                     "batch": 1, "latency_s": round(s, 4), "speedup_vs_1gpu": round(s1 / s, 3),
                     "psnr_db": None if quality is None else round(quality, 1),
                     **({"patch_warmup": int(extra[1])} if mode == "patch" else {})})
        lines.append(f"| {model} | {size} | {steps} | {gpus} | {mode} | {s:.3f} | {s / s1:.2f}x | "
                     + ("-" if quality is None else f"{quality:.1f} (lowest of 3)") + " |")
        print(lines[-1], flush=True)


def vae_split_decode(work: str, model: str, sizes: list[int], gpu_counts: list[int], rows: list, lines: list,
                     repeats: int = 10) -> None:
    """The VAE decode of one image whole on every rank against split in bands over the ranks, per GPU count (one
    torchrun job of vae_split_decode.py each); rows and table lines appended."""
    for gpus in gpu_counts:
        out = os.path.join(work, f"vae-split-{model}-{gpus}.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
               VAE_SPLIT_WORKER, "--model", model, "--sizes", ",".join(map(str, sizes)), "--repeats", str(repeats),
               "--out", out]
        print("$ " + " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "4"})
        if proc.returncode:
            raise SystemExit(f"vae-split decode of {model} on {gpus} GPUs failed:\n{proc.stderr[-4000:]}")
        with open(out) as f:
            for row in json.load(f):
                rows.append({"mode": "vae-split decode", **row})
                lines.append(f"| {model} | {row['size']} | {gpus} | {row['bands']} x {row['band_rows']} of "
                             f"{row['latent_rows']} | {row['whole_ms']:.1f} | {row['split_ms']:.1f} | "
                             f"{row['split_vs_whole']:.2f}x | {row['psnr_db']:.1f} |")
                print(lines[-1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", default="1,2,4", help="GPU counts for the throughput rows")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4, help="prompts per pipeline call in the throughput rows")
    parser.add_argument("--model", default="sd15")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--latency-model", nargs="*", default=["sd15"], choices=sorted(LATENCY))
    parser.add_argument("--seq-model", nargs="*", default=[], choices=SEQ_MODELS,
                        help="diffusion transformers for the sequence-parallel latency rows")
    parser.add_argument("--seq-gpus", default="2,4", help="GPU counts for the sequence-parallel rows")
    parser.add_argument("--patch-model", nargs="*", default=[], choices=sorted(LATENCY),
                        help="UNets for the patch-parallel (DistriFusion) latency rows")
    parser.add_argument("--patch-gpus", default="2,4", help="GPU counts for the patch-parallel rows")
    parser.add_argument("--patch-warmup", type=int, default=1, help="synchronous steps per image in the patch rows")
    parser.add_argument("--vae-split-model", nargs="*", default=["sdxl", "flux"], choices=sorted(LATENCY) + ["flux"],
                        help="VAEs for the split-decode rows (sdxl: SD's VAE; flux: the 16-channel one of SD3 / Flux)")
    parser.add_argument("--vae-split-sizes", default="1024,2048", help="image sides for the split-decode rows")
    parser.add_argument("--vae-split-gpus", default="2,4", help="GPU counts for the split-decode rows")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()

    rows, lines = [], []
    with tempfile.TemporaryDirectory() as work:
        common = ["--model", args.model, "--height", str(args.size), "--width", str(args.size),
                  "--steps", str(args.steps), "--batch", str(args.batch)]
        lines += [f"## Throughput: {args.prompts} prompts, {args.model} {args.size}x{args.size}, {args.steps} steps, "
                  f"batch {args.batch} per call, data parallel", "",
                  "| GPUs | images/s | speed-up vs 1 GPU | generation s | setup s | warm-up s | images equal 1-GPU |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
        base = None
        for gpus in [int(g) for g in args.gpus.split(",")]:
            run, images = generate(work, f"data{gpus}", gpus, prompts(args.prompts), *common)
            t = run["timings"]
            base = base or (t["images_per_s"], images)
            equal = sum(np.array_equal(a, b) for a, b in zip(base[1], images))
            row = {"gpus": gpus, "mode": "data", "model": args.model, "height": args.size, "width": args.size,
                   "steps": args.steps, "batch": args.batch, "prompts": args.prompts,
                   "images_per_s": round(t["images_per_s"], 3),
                   "speedup_vs_1gpu": round(t["images_per_s"] / base[0], 3), "generate_s": round(t["generate_s"], 3),
                   "setup_s": round(t["setup_s"], 1), "warmup_s": round(t["warmup_s"], 2),
                   "images_equal_1gpu": f"{equal}/{len(images)}"}
            rows.append(row)
            lines.append(f"| {gpus} | {row['images_per_s']:.2f} | {row['speedup_vs_1gpu']:.2f}x | {row['generate_s']:.2f} "
                         f"| {row['setup_s']:.0f} | {row['warmup_s']:.1f} | {row['images_equal_1gpu']} |")
            print(lines[-1], flush=True)

        lines += ["", "## Latency: one image at a time (batch 1), 1 GPU vs CFG-parallel on 2 GPUs", "",
                  "| model | size | steps | GPUs | mode | s per image (median) | vs 1 GPU | PSNR vs 1 GPU dB |",
                  "|---|---:|---:|---:|---|---:|---:|---:|"]
        bounds = []
        for model in args.latency_model:
            spec = LATENCY[model]
            lat = ["--model", model, "--height", str(spec["size"]), "--width", str(spec["size"]),
                   "--steps", str(spec["steps"]), "--batch", "1"]
            single, ref = generate(work, f"lat1-{model}", 1, prompts(spec["prompts"]), *lat)
            s1, cfg_runs = single["timings"]["median_round_s"], []
            for vae_split in ("off", "on"):  # the decode whole on each rank of the pair, or in bands over the pair
                cfg, got = generate(work, f"cfg2-{model}-{vae_split}", 2, prompts(spec["prompts"]), *lat, "--mode",
                                    "cfg", "--vae-split", vae_split)
                cfg_runs.append((vae_split, cfg["timings"]["median_round_s"],
                                 min(psnr(a / 255.0, b / 255.0) for a, b in zip(ref, got)), len(got)))  # 8-bit PNGs
            bound = split_bound(model, spec["size"])
            bounds.append(f"- {model} {spec['size']}x{spec['size']}: UNet step {bound['unet_b2_ms']:.2f} ms on the CFG "
                          f"batch of 2, {bound['unet_b1_ms']:.2f} ms on half of it "
                          f"({bound['unet_b1_ms'] / bound['unet_b2_ms']:.2f}x); VAE decode of one image "
                          f"{bound['vae_decode_b1_ms']:.1f} ms (both ranks of a pair run it with --vae-split off).")
            for gpus, mode, vae_split, s, quality, images in ((1, "data", None, s1, None, 0),
                                                              *((2, "cfg", *run) for run in cfg_runs)):
                rows.append({"gpus": gpus, "mode": mode, "model": model, "height": spec["size"], "width": spec["size"],
                             "steps": spec["steps"], "batch": 1, "latency_s": round(s, 4),
                             "speedup_vs_1gpu": round(s1 / s, 3), "psnr_db": None if gpus == 1 else round(quality, 1),
                             **({"psnr_images": images, "vae_split": vae_split} if gpus == 2 else {}),
                             **({"unet_b2_ms": round(bound["unet_b2_ms"], 2),
                                 "unet_b1_ms": round(bound["unet_b1_ms"], 2),
                                 "vae_decode_b1_ms": round(bound["vae_decode_b1_ms"], 1)} if gpus == 1 else {})})
                label = mode if gpus == 1 else f"{mode}, vae split {vae_split}"
                lines.append(f"| {model} | {spec['size']} | {spec['steps']} | {gpus} | {label} | {s:.3f} | "
                             f"{s / s1:.2f}x | "
                             + ("-" if gpus == 1 else f"{quality:.1f} (lowest of {images})") + " |")
                print(lines[-1], flush=True)
        if bounds:
            lines += ["", "One GPU, optimized, device time of a graph replay (what bounds the cfg rows):", ""] + bounds
        if args.seq_model:
            lines += ["", "## Latency: one image at a time (batch 1), 1 GPU vs sequence parallelism", "",
                      "| model | size | steps | GPUs | mode | s per image (median) | vs 1 GPU | PSNR vs 1 GPU dB |",
                      "|---|---:|---:|---:|---|---:|---:|---:|"]
            for model in args.seq_model:
                seq_latency(work, model, [int(g) for g in args.seq_gpus.split(",")], rows, lines)
        if args.patch_model:
            lines += ["", f"## Latency: one image at a time (batch 1), 1 GPU vs patch parallelism ({args.patch_warmup} "
                      "synchronous step(s) per image)", "",
                      "| model | size | steps | GPUs | mode | s per image (median) | vs 1 GPU | PSNR vs 1 GPU dB |",
                      "|---|---:|---:|---:|---|---:|---:|---:|"]
            for model in args.patch_model:
                patch_latency(work, model, [int(g) for g in args.patch_gpus.split(",")], args.patch_warmup, rows,
                              lines)
        if args.vae_split_model:
            lines += ["", "## The VAE decode of one image: whole on every rank vs split in bands over the ranks", "",
                      "| VAE of | size | GPUs | bands x latent rows | whole ms | split ms | split vs whole | PSNR vs "
                      "whole dB |", "|---|---:|---:|---|---:|---:|---:|---:|"]
            for model in args.vae_split_model:
                vae_split_decode(work, model, [int(s) for s in args.vae_split_sizes.split(",")],
                                 [int(g) for g in args.vae_split_gpus.split(",")], rows, lines)
    print(write_results("parallel", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
