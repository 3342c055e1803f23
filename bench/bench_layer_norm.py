"""LayerNorm at SD transformer shapes: torch.nn.functional.layer_norm vs rocm_sd::layer_norm.

    python bench/bench_layer_norm.py [--out-dir bench/results] [--dtype float16]

Bytes counted: one read of x and one write of y.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import copy_ceiling_gbps, device_ms, rotating_inputs, write_results  # noqa: E402
from rocm_sd.ops.layer_norm import layer_norm_kernel, layer_norm_ref, supports  # noqa: E402
from tests.ops.test_layer_norm import LAYER_NORM_SD  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    ceiling = copy_ceiling_gbps()
    rows = [{"op": "copy", "shape": "1Gi fp16", "gbps": round(ceiling, 1)}]
    lines = [f"Copy ceiling (read + write): {ceiling:.0f} GB/s. Device time from graph replays over rotating inputs.",
             "", "| x shape | torch ms | rocm_sd ms | speed-up | rocm_sd GB/s | % of copy |", "|---|---:|---:|---:|---:|---:|"]
    for shape in LAYER_NORM_SD:
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        inputs = rotating_inputs(lambda: torch.randn(shape, device="cuda", dtype=dtype), nbytes)
        c = shape[-1]
        w = torch.rand(c, device="cuda", dtype=dtype) + 0.5
        b = torch.randn(c, device="cuda", dtype=dtype)
        why = supports(inputs[0], w, b, 1e-5)
        if why:
            raise SystemExit(f"rocm_sd kernel cannot run {shape}: {why}")
        times = {"torch": device_ms(lambda x: layer_norm_ref(x, w, b, 1e-5), inputs),
                 "rocm_sd": device_ms(lambda x: layer_norm_kernel(x, w, b, 1e-5), inputs)}
        moved = nbytes * 2
        for backend, ms in times.items():
            gbps = moved / ms / 1e6
            rows.append({"op": "layer_norm", "shape": str(shape), "dtype": args.dtype, "backend": backend,
                         "ms": round(ms, 4), "gbps": round(gbps, 1), "pct_copy": round(100 * gbps / ceiling, 1)})
        k = rows[-1]
        lines.append(f"| {shape} | {times['torch']:.4f} | {times['rocm_sd']:.4f} | "
                     f"{times['torch'] / times['rocm_sd']:.1f}x | {k['gbps']:.0f} | {k['pct_copy']:.1f} |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    stem = write_results(f"layer_norm-{args.dtype}", rows, table, args.out_dir)
    print(table)
    print(f"written: {stem}.md/.json")


if __name__ == "__main__":
    main()
