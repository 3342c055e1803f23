"""Where one optimized generation's time goes: wall time, the UNet's and the VAE decode's device time (CUDA events
around each call), the time between UNet calls (CFG combine, scheduler step, callbacks) and how busy the GPU is
(union of kernel intervals under torch.profiler). Random weights from the architecture's config, as `rocm_sd bench`.

    python3 bench/time_breakdown.py [--model sd15] [--steps 50]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import rocm_sd
from rocm_sd import models


class CallTimer:
    """CUDA events recorded before and after each call of a module or function."""

    def __init__(self):
        self.spans, self._open = [], None

    def begin(self, *_args, **_kwargs):
        self._open = torch.cuda.Event(enable_timing=True)
        self._open.record()

    def end(self, *_args, **_kwargs):
        done = torch.cuda.Event(enable_timing=True)
        done.record()
        self.spans.append((self._open, done))

    def ms(self) -> list[float]:
        return [a.elapsed_time(b) for a, b in self.spans]


def busy_fraction(generate) -> tuple[float, float, float]:
    """(span ms, busy ms, idle ms in gaps over 10 us) of the device activity of one generation."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate()
        torch.cuda.synchronize()
    intervals = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    busy, idle, start, end = 0.0, 0.0, None, None
    for s, e in intervals:
        if end is None or s > end:
            if end is not None:
                busy += end - start
                idle += (s - end) if s - end > 10 else 0.0
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    return (intervals[-1][1] - intervals[0][0]) / 1e3, busy / 1e3, idle / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sd15", choices=["sd15", "sd21", "sdxl"])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    size = models.default_size(args.model)
    pipe = models.build_sd_pipeline(args.model, "cuda", torch.float16)
    kwargs = models.prompt_kwargs(pipe, "a photograph of an astronaut riding a horse", "", 1)
    rocm_sd.optimize(pipe)

    def generate():
        with torch.no_grad():
            return pipe(**kwargs, num_inference_steps=args.steps, generator=torch.Generator("cuda").manual_seed(0),
                        height=size, width=size, output_type="np").images

    for _ in range(3):
        generate()
    walls = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        generate()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t)

    unet, vae = CallTimer(), CallTimer()
    hooks = [pipe.unet.register_forward_pre_hook(unet.begin), pipe.unet.register_forward_hook(unet.end)]
    decode = pipe.vae.decode
    patched_decode = "decode" in vars(pipe.vae)  # optimize() may have set its own on the instance

    def timed_decode(*a, **k):
        vae.begin()
        out = decode(*a, **k)
        vae.end()
        return out

    pipe.vae.decode = timed_decode
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    generate()
    last.record()
    torch.cuda.synchronize()
    for hook in hooks:
        hook.remove()
    if patched_decode:
        pipe.vae.decode = decode
    else:
        del pipe.vae.decode  # the class's method again
    total, unet_ms, vae_ms = first.elapsed_time(last), unet.ms(), vae.ms()
    between = [unet.spans[i][1].elapsed_time(unet.spans[i + 1][0]) for i in range(len(unet.spans) - 1)]
    rest = total - sum(unet_ms) - sum(between) - sum(vae_ms)
    span, busy, idle = busy_fraction(generate)

    print(f"{args.model} {size}x{size}, {args.steps} steps, batch 1 + CFG, fp16, rocm_sd.optimize defaults\n")
    print("| part | ms | share |\n|---|---:|---:|")
    for name, ms in [(f"UNet ({len(unet_ms)} calls, median {statistics.median(unet_ms):.3f} ms)", sum(unet_ms)),
                     ("between UNet calls (CFG combine, scheduler step, callbacks)", sum(between)),
                     ("VAE decode", sum(vae_ms)),
                     ("the rest (pipeline set-up before the first UNet call, output conversion)", rest)]:
        print(f"| {name} | {ms:.1f} | {100 * ms / total:.1f}% |")
    print(f"| one generation (CUDA events) | {total:.1f} | 100% |")
    print(f"\nwall time, median of {len(walls)}: {statistics.median(walls) * 1e3:.1f} ms "
          f"({', '.join(f'{w * 1e3:.1f}' for w in walls)})")
    print(f"under torch.profiler: device activity spans {span:.1f} ms, busy {busy:.1f} ms ({100 * busy / span:.1f}%), "
          f"idle gaps over 10 us {idle:.2f} ms")


if __name__ == "__main__":
    main()
