"""`python -m rocm_sd.jit`: compiles every runtime-compiled kernel source for each GPU torch sees (or --arch),
with a progress bar, into the cache the ops read (ROCM_SD_JIT_CACHE): a first pipeline run then starts at once.
Prints each unit's time and whether it came from the cache."""
from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from .. import platform
from . import sources
from .backend import JitBackend


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rocm_sd.jit", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", help="an arch to compile for (sm_90, gfx942, ...); repeatable")
    args = parser.parse_args(argv)
    if args.arch:
        archs = args.arch
        gpu_platform = "hip" if archs[0].startswith("gfx") else "cuda"
    elif platform.gpu_available():
        import torch

        archs = sorted({platform.device_arch(i) for i in range(torch.cuda.device_count())})
        gpu_platform = platform.torch_gpu_platform()
    else:
        parser.error("torch sees no GPU: name the arch to compile for with --arch")
    backend = JitBackend(gpu_platform)
    why = backend.unavailable_reason()
    if why:
        print(f"rocm_sd.jit: {why}", file=sys.stderr)
        return 1
    total = 0.0
    for arch in archs:
        for name in tqdm(sources.UNITS, desc=f"rocm_sd kernels for {arch}"):
            backend.compile_unit(name, arch)
            seconds, cached = backend.compiles[(name, arch)]
            total += seconds
            tqdm.write(f"{name} {arch}: {seconds:.2f} s{' (cached)' if cached else ''}")
    print(f"{len(sources.UNITS) * len(archs)} units in {total:.1f} s; cache: {backend.cache.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
