"""GroupNorm+SiLU at SD shapes: torch (GroupNorm then SiLU) vs rocm_sd, device time, GB/s, % of copy.

    python bench/bench_group_norm.py [--out-dir bench/results] [--dtype float16]

Bytes counted: one read of x and one write of y (the least any implementation must move).
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import (copy_ceiling_gbps, device_ms, kernel_bench_args, rotating_inputs, same_bytes_copy_ms,  # noqa: E402
                           write_results)
from rocm_sd.ops.group_norm import describe, group_norm_kernel, supports  # noqa: E402
from tests.shapes import GROUP_NORM_SD, GROUP_NORM_SD15_UP  # noqa: E402

FORCED_PATHS = ("resident", "split")


def eager_call_us(fn, x, calls: int = 2000) -> float:
    """Wall microseconds per eager call, launch included: what an un-captured pipeline pays."""
    for _ in range(50):
        fn(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    args = kernel_bench_args(__doc__)
    dtype = getattr(torch, args.dtype)
    ceiling = copy_ceiling_gbps()
    rows = []
    for shape in GROUP_NORM_SD + GROUP_NORM_SD15_UP:
        c = shape[1]
        w = torch.rand(c, device="cuda", dtype=dtype) + 0.5
        b = torch.randn(c, device="cuda", dtype=dtype)
        for layout in ("nchw", "nhwc"):
            fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            inputs = rotating_inputs(lambda: torch.randn(shape, device="cuda", dtype=dtype).to(memory_format=fmt), nbytes)
            why = supports(inputs[0], 32, w, b, 1e-6, True)
            if why:
                raise SystemExit(f"rocm_sd kernel cannot run {shape} {layout}: {why}")
            times = {
                "torch": device_ms(lambda x: F.silu(F.group_norm(x, 32, w, b, 1e-6)), inputs),
                "rocm_sd": device_ms(lambda x: group_norm_kernel(x, 32, w, b, 1e-6, True), inputs),
            }
            path = describe(inputs[0], 32)
            copy_ms = same_bytes_copy_ms(2 * nbytes)
            for forced in FORCED_PATHS:  # each path, for comparison
                if not describe(inputs[0], 32, forced).startswith("error"):
                    times[f"rocm_sd-{forced}"] = device_ms(
                        lambda x: group_norm_kernel(x, 32, w, b, 1e-6, True, path=forced), inputs)
            for backend, ms in times.items():
                gbps = 2 * nbytes / ms / 1e6
                rows.append({"op": "group_norm+silu", "shape": str(shape), "layout": layout, "dtype": args.dtype,
                             "backend": backend, "ms": round(ms, 4), "gbps": round(gbps, 1),
                             "pct_copy": round(100 * gbps / ceiling, 1), "same_bytes_copy_ms": round(copy_ms, 4),
                             "pct_same_bytes_copy": round(100 * copy_ms / ms, 1),
                             **({"path": path} if backend == "rocm_sd" else {})})
            print(f"{shape} {layout}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in times.items()), flush=True)

    lines = [f"Copy ceiling (read + write): {ceiling:.0f} GB/s. Device time from graph replays over rotating inputs.",
             "GB/s counts one read of x and one write of y. The last columns force each path, for comparison",
             "(- : the path cannot take the shape; see hip/group_norm/group_norm.hip). 'same-bytes copy': a streaming copy",
             "kernel moving the same bytes at this size; '% same-bytes' is its time over rocm_sd's.",
             "", "| shape | layout | torch ms | rocm_sd ms | speed-up | rocm_sd GB/s | % of copy | same-bytes copy ms | "
             "% same-bytes | path | " + " | ".join(f"{p} ms" for p in FORCED_PATHS) + " |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|" + "---:|" * len(FORCED_PATHS)]
    by_case = {}
    for row in rows:
        by_case.setdefault((row["shape"], row["layout"]), {})[row["backend"]] = row
    for (shape, layout), r in by_case.items():
        t, k = r["torch"], r["rocm_sd"]
        forced = " | ".join(f"{r[f'rocm_sd-{p}']['ms']:.4f}" if f"rocm_sd-{p}" in r else "-" for p in FORCED_PATHS)
        lines.append(f"| {shape} | {layout} | {t['ms']:.4f} | {k['ms']:.4f} | {t['ms'] / k['ms']:.1f}x | "
                     f"{k['gbps']:.0f} | {k['pct_copy']:.1f} | {k['same_bytes_copy_ms']:.4f} | "
                     f"{k['pct_same_bytes_copy']:.1f} | {k['path']} | {forced} |")
    # Host cost of one eager call at a small UNet shape, where the GPU work is a few microseconds.
    x = torch.randn(2, 1280, 8, 8, device="cuda", dtype=dtype)
    w = torch.rand(1280, device="cuda", dtype=dtype)
    b = torch.randn(1280, device="cuda", dtype=dtype)
    with torch.no_grad():
        torch_us = eager_call_us(lambda x: F.silu(F.group_norm(x, 32, w, b, 1e-6)), x)
        op_us = eager_call_us(lambda x: torch.ops.rocm_sd.group_norm(x, 32, w, b, 1e-6, True), x)
    lines += ["", "Eager wall time per call at (2, 1280, 8, 8), launch and Python included (what a pipeline without "
              "graph capture pays):", "", "| torch GroupNorm+SiLU us | torch.ops.rocm_sd.group_norm us |", "|---:|---:|",
              f"| {torch_us:.1f} | {op_us:.1f} |"]
    rows.append({"op": "group_norm+silu eager call", "shape": "(2, 1280, 8, 8)", "dtype": args.dtype,
                 "torch_us": round(torch_us, 1), "rocm_sd_us": round(op_us, 1)})
    rows.insert(0, {"op": "copy", "shape": "1Gi fp16", "gbps": round(ceiling, 1)})
    print(write_results("group_norm", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
