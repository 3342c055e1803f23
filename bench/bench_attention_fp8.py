"""FP8 attention (rocm_sd::attention_fp8, its quantize pass included) against the fp16 attention it replaces (torch
SDPA: cuDNN / flash on NVIDIA, AOTriton on ROCm), at the SD shapes, with the error each adds to exact attention.

    python bench/bench_attention_fp8.py [--out-dir bench/results] [--dtype float16]

FLOPs counted: 4 * B * H * Lq * Lk * D. Device time from graph replays over rotating inputs (bench/harness.py).
Errors: max |out - exact| / max |exact| against float64 attention of the same inputs (first input set). The last
column is what the tuner would keep: FP8 only where it is faster.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.bench_attention import make_inputs, timed  # noqa: E402
from bench.harness import kernel_bench_args, write_results  # noqa: E402
from rocm_sd import platform  # noqa: E402
from rocm_sd.ops.attention import attention_ref  # noqa: E402
from rocm_sd.ops.attention_fp8 import attention_fp8_kernel, describe, supports  # noqa: E402
from rocm_sd.ops.quantize import fp8_format  # noqa: E402
from tests.shapes import ATTENTION_SD  # noqa: E402


def relative_error(out: torch.Tensor, exact: torch.Tensor) -> float:
    return ((out.double() - exact).abs().max() / exact.abs().max()).item()


def main() -> None:
    args = kernel_bench_args(__doc__)
    dtype = getattr(torch, args.dtype)
    fmt, why = fp8_format(platform.device_arch(torch.device("cuda")))
    if fmt is None:
        raise SystemExit(f"no FP8 attention on this GPU: {why}")
    rows = []
    lines = [f"FP8 format {fmt}. FLOPs: 4 B H Lq Lk D; TFLOP/s in parentheses. Error: max |out - exact| / max |exact|.",
             "", "| B, Lq, Lk, H, D | SDPA ms (TF/s) | FP8 ms (TF/s) | FP8 / SDPA | SDPA error | FP8 error | instance | "
             "keep |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for shape in [s for s in ATTENTION_SD if s[-1] <= 160]:
        batch, q_len, kv_len, heads, dim = shape
        flops = 4 * batch * heads * q_len * kv_len * dim
        inputs = [a + (fmt,) for a in make_inputs(shape, dtype)]
        q, k, v, scale, _ = inputs[0]
        if supports(q, k, v, scale, fmt):
            raise SystemExit(f"the FP8 kernel cannot run {shape}: {supports(q, k, v, scale, fmt)}")
        sdpa_ms = timed(lambda q, k, v, s, f: attention_ref(q, k, v, s), inputs)
        fp8_ms = timed(attention_fp8_kernel, inputs)
        exact = attention_ref(q.double(), k.double(), v.double(), scale)
        sdpa_err = relative_error(attention_ref(q, k, v, scale), exact)
        fp8_err = relative_error(attention_fp8_kernel(q, k, v, scale, fmt), exact)
        tf = lambda ms: flops / ms / 1e9  # noqa: E731
        ratio = sdpa_ms / fp8_ms
        instance = describe(q, k, v, scale, fmt).split()[0]
        rows.append({"shape": list(shape), "dtype": args.dtype, "format": fmt, "sdpa_ms": round(sdpa_ms, 4),
                     "fp8_ms": round(fp8_ms, 4), "fp8_vs_sdpa": round(ratio, 3), "sdpa_tflops": round(tf(sdpa_ms), 1),
                     "fp8_tflops": round(tf(fp8_ms), 1), "sdpa_rel_err": sdpa_err, "fp8_rel_err": fp8_err,
                     "instance": instance})
        lines.append(f"| {batch}, {q_len}, {kv_len}, {heads}, {dim} | {sdpa_ms:.4f} ({tf(sdpa_ms):.0f}) | "
                     f"{fp8_ms:.4f} ({tf(fp8_ms):.0f}) | {ratio:.2f} | {sdpa_err:.1e} | {fp8_err:.1e} | {instance} | "
                     f"{'FP8' if ratio > 1 else 'fp16'} |")
        print(lines[-1], flush=True)
    print(write_results("attention_fp8", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
