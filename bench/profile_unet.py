"""One SD1.5 UNet evaluation (batch 2 = one CFG step at 512x512, fp16) under torch.profiler: a per-op
device-time table like the profiler's, and the elementwise/copy calls with their shapes, which is where
fusions are still to be found.

    python bench/profile_unet.py [--engine rocm_sd|eager] [--rows 25] > profile.txt

Graphs are off (the profiler must see each op); the rocm_sd engine is optimize() with its defaults.
"""
import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

import rocm_sd
from rocm_sd import models

ELEMENTWISE = ("aten::copy_", "aten::contiguous", "aten::clone", "aten::add", "aten::add_", "aten::to",
               "aten::_to_copy", "aten::cat", "aten::mul")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("rocm_sd", "eager"), default="rocm_sd")
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args()
    pipe = models.build_sd_pipeline("sd15", "cuda", torch.float16)
    if args.engine == "rocm_sd":
        rocm_sd.optimize(pipe, cuda_graph=False)
    x = torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.float16)
    ctx = torch.randn(2, 77, 768, device="cuda", dtype=torch.float16)
    t = torch.tensor(500.0, device="cuda")
    with torch.inference_mode():
        for _ in range(3):
            pipe.unet(x, t, ctx)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            pipe.unet(x, t, ctx)
            torch.cuda.synchronize()
    calls, device_us = collections.Counter(), collections.defaultdict(float)
    for event in prof.events():
        if event.name in ELEMENTWISE:
            key = (event.name, str(event.input_shapes)[:90])
            calls[key] += 1
            device_us[key] += event.device_time_total
    print(f"# {args.engine}: elementwise and copy calls of one UNet evaluation, by device time\n")
    for key in sorted(calls, key=lambda k: -device_us[k])[:30]:
        print(f"{device_us[key] / 1000:8.3f} ms  x{calls[key]:3d}  {key[0]:18s} {key[1]}")
    print(f"\n# {args.engine}: per-op device time\n")
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
