"""Attention at the SD shapes: torch SDPA (what torch dispatches: cuDNN / flash on NVIDIA, AOTriton on
ROCm) vs rocm_sd's flash-attention kernel, its heuristic instance and its best instance, in TFLOP/s.

    python bench/bench_attention.py [--out-dir bench/results] [--dtype float16]

FLOPs counted: 4 * B * H * Lq * Lk * D (the two matrix products). Inputs are [B, L, H, D] views of one
packed projection as the UNet makes them; device time from graph replays (bench/harness.py). The last
column is what the dispatcher should do at that shape once tuned: the faster of the two.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import device_ms, kernel_bench_args, rotating_inputs, write_results  # noqa: E402
from rocm_sd.ops.attention import attention_kernel, attention_ref, describe, instance_fits, instances, supports  # noqa: E402
from tests.shapes import ATTENTION_SD  # noqa: E402


def make_inputs(shape, dtype):
    batch, q_len, kv_len, heads, dim = shape

    def make():
        q = torch.randn(batch, q_len, heads, dim, device="cuda", dtype=dtype)
        kv = torch.randn(batch, kv_len, 2, heads, dim, device="cuda", dtype=dtype)
        return q, kv[:, :, 0], kv[:, :, 1], 1.0 / dim ** 0.5

    per_input = (batch * q_len * heads * dim + 2 * batch * kv_len * heads * dim) * dtype.itemsize
    return rotating_inputs(make, per_input)


def timed(fn, inputs) -> float:
    return device_ms(lambda args: fn(*args), inputs)


def main() -> None:
    args = kernel_bench_args(__doc__)
    dtype = getattr(torch, args.dtype)
    rows = []
    lines = ["FLOPs: 4 B H Lq Lk D. Device time from graph replays over rotating inputs; TFLOP/s in parentheses.", "",
             "| B, Lq, Lk, H, D | SDPA ms (TF/s) | rocm_sd heuristic ms (TF/s) | best instance | best ms (TF/s) | "
             "best / SDPA | pick |", "|---|---:|---:|---|---:|---:|---|"]
    for shape in ATTENTION_SD:
        batch, q_len, kv_len, heads, dim = shape
        flops = 4 * batch * heads * q_len * kv_len * dim
        inputs = make_inputs(shape, dtype)
        q, k, v, scale = inputs[0]
        if supports(q, k, v, scale):
            raise SystemExit(f"rocm_sd kernel cannot run {shape}: {supports(q, k, v, scale)}")
        sdpa_ms = timed(attention_ref, inputs)
        heuristic = describe(q, k, v, scale).split()[0]
        per_instance = {}
        for name in instances():
            if instance_fits(name, dtype, dim) and not supports(q, k, v, scale, name):
                per_instance[name] = timed(lambda *a, _n=name: attention_kernel(*a, instance=_n), inputs)
        best = min(per_instance, key=per_instance.get)
        tf = lambda ms: flops / ms / 1e9  # noqa: E731
        ratio = sdpa_ms / per_instance[best]
        rows.append({"shape": list(shape), "dtype": args.dtype, "sdpa_ms": round(sdpa_ms, 4), "sdpa_tflops": round(tf(sdpa_ms), 1),
                     "heuristic": heuristic, "heuristic_ms": round(per_instance[heuristic], 4),
                     "best": best, "best_ms": round(per_instance[best], 4), "best_tflops": round(tf(per_instance[best]), 1),
                     "best_vs_sdpa": round(ratio, 3), "instances_ms": {n: round(t, 4) for n, t in per_instance.items()}})
        lines.append(f"| {batch}, {q_len}, {kv_len}, {heads}, {dim} | {sdpa_ms:.4f} ({tf(sdpa_ms):.0f}) | "
                     f"{per_instance[heuristic]:.4f} ({tf(per_instance[heuristic]):.0f}) | {best} | "
                     f"{per_instance[best]:.4f} ({tf(per_instance[best]):.0f}) | {ratio:.2f} | "
                     f"{'rocm_sd' if ratio > 1 else 'SDPA'} |")
        print(lines[-1], flush=True)
    print(write_results("attention", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
