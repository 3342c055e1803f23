"""First-use cost of the runtime-compiled kernels (rocm_sd/jit/): per source unit, the compile on an empty cache
(cold), the same unit read back from the disk cache (cached: what every later process pays), and loading it into
the GPU; totals over all units.

    python bench/bench_jit.py [--out-dir bench/results] [--repeats 3]

On a GPU: the device's arch, hiprtc (ROCm) or NVRTC (CUDA) as the JIT backend uses them, and a row in
bench/results/data/jit-<device>.jsonl. Without one, `--arch sm_90` (or gfx942 with hiprtc) times the compiles
alone and prints them (no result row: no device). Each repeat compiles into a fresh temporary cache.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import write_results  # noqa: E402
from rocm_sd import platform  # noqa: E402
from rocm_sd.jit import sources  # noqa: E402
from rocm_sd.jit.backend import JitBackend  # noqa: E402
from rocm_sd.jit.cache import KernelCache  # noqa: E402


def time_units(arch: str, gpu_platform: str, repeats: int, device: int | None) -> list[dict]:
    cold: dict[str, list[float]] = {name: [] for name in sources.UNITS}
    cached: dict[str, list[float]] = {name: [] for name in sources.UNITS}
    load: dict[str, list[float]] = {name: [] for name in sources.UNITS}
    instances = {name: len(unit.expressions) for name, unit in sources.UNITS.items()}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="rocm_sd-jit-bench-") as folder:
            backend = JitBackend(gpu_platform, KernelCache(Path(folder)))
            for name in tqdm(sources.UNITS, desc=f"cold compiles for {arch}", leave=False):
                backend.compile_unit(name, arch)
                cold[name].append(backend.compiles[(name, arch)][0])
            warm = JitBackend(gpu_platform, KernelCache(Path(folder)))  # a later process: same cache, nothing loaded
            for name in sources.UNITS:
                warm.compile_unit(name, arch)
                seconds, from_disk = warm.compiles[(name, arch)]
                assert from_disk, f"{name} was compiled again instead of read from the cache"
                cached[name].append(seconds)
                if device is not None:
                    start = time.perf_counter()
                    warm._load(device, name)
                    torch.cuda.synchronize(device)
                    load[name].append(time.perf_counter() - start)
    rows = []
    for name in sources.UNITS:
        rows.append({"unit": name, "arch": arch, "instances": instances[name],
                     "cold_s": round(statistics.median(cold[name]), 3),
                     "cached_s": round(statistics.median(cached[name]), 4),
                     "load_s": round(statistics.median(load[name]), 4) if load[name] else None})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arch", help="compile for this arch without a GPU (sm_90, gfx942, ...)")
    args = parser.parse_args()
    on_gpu = platform.gpu_available() and not args.arch
    if on_gpu:
        device = torch.cuda.current_device()
        arch, gpu_platform = platform.device_arch(device), platform.torch_gpu_platform()
    elif args.arch:
        device, arch, gpu_platform = None, args.arch, "hip" if args.arch.startswith("gfx") else "cuda"
    else:
        parser.error("no GPU: give --arch to time the compiles alone")
    backend = JitBackend(gpu_platform)
    why = backend.unavailable_reason()
    if why:
        sys.exit(f"bench_jit: {why}")
    rows = time_units(arch, gpu_platform, args.repeats, device)
    lines = [f"{backend.compiler().label}, {arch}; medians of {args.repeats}",
             "| unit | instances | cold compile s | cached s | load s |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['unit']} | {r['instances']} | {r['cold_s']:.2f} | {r['cached_s']:.4f} | "
                     f"{'' if r['load_s'] is None else format(r['load_s'], '.4f')} |")
    total = {k: sum(r[k] or 0 for r in rows) for k in ("cold_s", "cached_s", "load_s")}
    lines.append(f"| all | {sum(r['instances'] for r in rows)} | {total['cold_s']:.2f} | {total['cached_s']:.4f} | "
                 f"{total['load_s']:.4f} |")
    table = "\n".join(lines)
    if on_gpu:
        print(write_results("jit", rows + [{"unit": "all", "arch": arch, **{k: round(v, 4) for k, v in total.items()},
                                            "compiler": backend.compiler().label}], table, args.out_dir))
    else:
        print(table)


if __name__ == "__main__":
    main()
