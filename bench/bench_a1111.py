"""Seconds per sampling step and per image in a real AUTOMATIC1111 checkout: the webui's own "sdp" against the
rocm_sd extension (every feature on), SD1.5 at 512x512 and SDXL at 1024x1024, random-weight checkpoints of the
webui's own configs, fp16, txt2img through modules.processing (integrations/a1111/real_webui.py):

    python bench/bench_a1111.py --webui /path/to/stable-diffusion-webui --out DIR

Per model and engine: one warm-up image (graph captures happen there), then --images timed images of --steps Euler
steps each; "s/step" is the time inside the sampler divided by the steps (the webui's state.sampling_step timing
points are not public, so the sampler is timed through the UNet: first to last UNet call of an image, over the
steps' count), "s/image" the whole process_images call (text encoders, sampling, VAE decode). Appends the rows to
--out-dir/data/a1111-<device>.jsonl and prints a table; the images and a JSON copy go to --out.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("ROCM_SD_TUNE_DEFAULTS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "integrations", "a1111"))
sys.path.insert(0, ROOT)
import real_webui  # noqa: E402

SIZES = {"sd15": 512, "sdxl": 1024}
ENGINES = {"sdp": "sdp - scaled dot product", "rocm_sd": "rocm_sd - rocm_sd kernels (AMD GPUs)"}


class UNetTimer:
    """Times the UNet's calls from the outside (a forward pre-hook and hook on the DiffusionWrapper)."""

    def __init__(self, torch, wrapper):
        self.torch, self.calls = torch, []
        self.handles = [wrapper.register_forward_pre_hook(self._start), wrapper.register_forward_hook(self._end)]

    def _start(self, *args):
        self.torch.cuda.synchronize()
        self.calls.append([time.perf_counter(), None])

    def _end(self, *args):
        self.torch.cuda.synchronize()
        self.calls[-1][1] = time.perf_counter()

    def remove(self):
        for handle in self.handles:
            handle.remove()


def bench(modules, torch, arch, engine, args, out):
    real_webui.select_optimization(modules, ENGINES[engine])
    size = SIZES[arch]
    real_webui.txt2img(modules, size, args.steps, seed=1)  # warm-up: cuDNN choices, graph captures
    timer = UNetTimer(torch, modules.shared.sd_model.model)
    per_image, per_step = [], []
    try:
        for i in range(args.images):
            timer.calls.clear()
            torch.cuda.synchronize()
            start = time.perf_counter()
            processed = real_webui.txt2img(modules, size, args.steps, seed=2 + i)
            torch.cuda.synchronize()
            per_image.append(time.perf_counter() - start)
            per_step.append((timer.calls[-1][1] - timer.calls[0][0]) / len(timer.calls))
            processed.images[0].save(os.path.join(out, f"{arch}-{engine}-{i}.png"))
    finally:
        timer.remove()
    return {"model": arch, "size": size, "engine": engine, "steps": args.steps,
            "s_per_step": round(sorted(per_step)[len(per_step) // 2], 4),
            "s_per_image": round(sorted(per_image)[len(per_image) // 2], 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--webui", required=True, help="an AUTOMATIC1111 checkout with its repositories/ and "
                        "Python requirements installed")
    parser.add_argument("--out", required=True, help="folder for the images, the JSON copy and the webui's data")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"), help="bench results folder")
    parser.add_argument("--models", default="sd15,sdxl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--images", type=int, default=3)
    args = parser.parse_args()
    args.webui, args.out = os.path.abspath(args.webui), os.path.abspath(args.out)
    data = os.path.join(args.out, "webui-data")
    os.makedirs(args.out, exist_ok=True)
    argv = list(sys.argv)
    real_webui.offline_clip_cache(os.path.join(data, "huggingface"))
    modules = real_webui.start_webui(args.webui, data, "cuda")
    sys.argv = argv  # the results record this command
    import torch

    from bench.harness import write_results

    rows = []
    for arch in args.models.split(","):
        path = os.path.join(data, "models", "Stable-diffusion", f"rocm_sd-random-{arch}.safetensors")
        real_webui.write_random_checkpoint(args.webui, arch, path, dtype="F16")
        real_webui.load_checkpoint(modules, path)
        rows += [bench(modules, torch, arch, engine, args, args.out) for engine in ENGINES]
    lines = ["| model | size | engine | s/step | s/image | vs webui sdp (step) |", "|---|---:|---|---:|---:|---:|"]
    for row in rows:
        base = next(r for r in rows if r["model"] == row["model"] and r["engine"] == "sdp")
        row["speedup_step"] = round(base["s_per_step"] / row["s_per_step"], 3)
        lines.append(f"| {row['model']} | {row['size']} | {row['engine']} | {row['s_per_step']:.4f} | "
                     f"{row['s_per_image']:.3f} | {row['speedup_step']:.2f}x |")
    with open(os.path.join(args.out, "bench_a1111.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(write_results("a1111", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
