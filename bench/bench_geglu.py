"""GEGLU epilogue at SD1.5 feed-forward shapes: torch (chunk, gelu, mul) vs rocm_sd::geglu.

    python bench/bench_geglu.py [--out-dir bench/results] [--dtype float16]

Bytes counted: one read of x (rows x 2D) and one write of y (rows x D), the least any implementation moves.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import copy_ceiling_gbps, device_ms, rotating_inputs, write_results  # noqa: E402
from rocm_sd.ops.geglu import geglu_kernel, geglu_ref, supports  # noqa: E402
from tests.ops.test_geglu import GEGLU_SD  # noqa: E402


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
    for shape in GEGLU_SD:
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        inputs = rotating_inputs(lambda: torch.randn(shape, device="cuda", dtype=dtype), nbytes)
        why = supports(inputs[0])
        if why:
            raise SystemExit(f"rocm_sd kernel cannot run {shape}: {why}")
        times = {"torch": device_ms(geglu_ref, inputs), "rocm_sd": device_ms(geglu_kernel, inputs)}
        moved = nbytes * 3 // 2
        for backend, ms in times.items():
            gbps = moved / ms / 1e6
            rows.append({"op": "geglu", "shape": str(shape), "dtype": args.dtype, "backend": backend,
                         "ms": round(ms, 4), "gbps": round(gbps, 1), "pct_copy": round(100 * gbps / ceiling, 1)})
        k = rows[-1]
        lines.append(f"| {shape} | {times['torch']:.4f} | {times['rocm_sd']:.4f} | "
                     f"{times['torch'] / times['rocm_sd']:.1f}x | {k['gbps']:.0f} | {k['pct_copy']:.1f} |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    stem = write_results(f"geglu-{args.dtype}", rows, table, args.out_dir)
    print(table)
    print(f"written: {stem}.md/.json")


if __name__ == "__main__":
    main()
