"""RMSNorm of Q / K heads at the diffusion transformers' shapes (tests/shapes.py RMS_NORM_DIT): PyTorch eager's
sequence (the norm of each stream, the [text, image] concatenation, the rotary embedding: diffusers' ops), the same
reference under torch.compile, and rocm_sd::rms_norm, which does it in one pass.

    python bench/bench_rms_norm.py [--out-dir bench/results] [--dtype bfloat16]

Bytes counted: one read of x and lead, one write of the joined output, and the cos / sin tables once (float32),
the least any implementation must move.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import (copy_ceiling_gbps, kernel_bench_args, rotating_inputs, same_bytes_copy_ms,  # noqa: E402
                           write_results)
from rocm_sd.ops.rms_norm import rms_norm_kernel, rms_norm_ref, supports  # noqa: E402
from rocm_sd.timing import graph_device_ms  # noqa: E402
from tests.ops.test_rms_norm import make  # noqa: E402
from tests.shapes import RMS_NORM_DIT  # noqa: E402

BACKENDS = ("torch", "compile", "rocm_sd")  # torch: eager, as the other kernel benchmarks name it


def bytes_moved(shape, dtype) -> int:
    b, l, h, d, lead_len, rope, _ = shape
    rows = l + (lead_len or 0)
    return 2 * b * rows * h * d * dtype.itemsize + (2 * rows * d * 4 if rope else 0)


def setup(shape, dtype):
    """Rotating (x, lead) inputs; the weights and tables are shared, as a block's are across its calls."""
    _, weight, eps, _, lead_weight, cos, sin = make(shape, dtype, "cuda")

    def fresh():
        x, _, _, lead, *_ = make(shape, dtype, "cuda")
        return x, lead

    inputs = rotating_inputs(fresh, bytes_moved(shape, dtype))
    compiled = torch.compile(rms_norm_ref, dynamic=False)

    def call(fn):
        return lambda x, lead: fn(x, weight, eps, lead, lead_weight, cos, sin)

    fns = {"torch": call(rms_norm_ref), "compile": call(compiled), "rocm_sd": call(rms_norm_kernel)}
    x, lead = inputs[0]
    return inputs, fns, supports(x, weight, eps, lead, lead_weight, cos, sin)


def main() -> None:
    args = kernel_bench_args(__doc__, lambda parser: parser.set_defaults(dtype="bfloat16"))  # the DiTs run in bf16
    dtype = getattr(torch, args.dtype)
    ceiling = copy_ceiling_gbps()
    rows = [{"op": "copy", "shape": "1Gi fp16", "gbps": round(ceiling, 1)}]
    lines = [f"Copy ceiling (read + write, 1 GiB): {ceiling:.0f} GB/s. Device time from graph replays over rotating "
             "inputs; 'same-bytes copy': a streaming copy kernel moving the op's bytes (the last column: its time "
             "over rocm_sd's). Shape: (B, L, H, D, lead rows, rope, fused QKV view).", "",
             "| shape | eager ms | compile ms | rocm_sd ms | vs eager | vs compile | rocm_sd GB/s | % of copy | "
             "% of same-bytes copy |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in RMS_NORM_DIT:
        inputs, fns, reasons = setup(shape, dtype)
        if reasons:
            raise SystemExit(f"rocm_sd kernel cannot run {shape}: {reasons}")
        times = {name: graph_device_ms(fns[name], inputs) for name in BACKENDS}
        nbytes = bytes_moved(shape, dtype)
        copy_ms = same_bytes_copy_ms(nbytes)
        for backend, ms in times.items():
            gbps = nbytes / ms / 1e6
            rows.append({"op": "rms_norm", "shape": str(shape), "dtype": args.dtype, "backend": backend,
                         "ms": round(ms, 4), "gbps": round(gbps, 1), "pct_copy": round(100 * gbps / ceiling, 1),
                         "same_bytes_copy_ms": round(copy_ms, 4), "pct_same_bytes_copy": round(100 * copy_ms / ms, 1)})
        k = rows[-1]
        lines.append(f"| {shape} | {times['torch']:.4f} | {times['compile']:.4f} | {times['rocm_sd']:.4f} | "
                     f"{times['torch'] / times['rocm_sd']:.2f}x | {times['compile'] / times['rocm_sd']:.2f}x | "
                     f"{k['gbps']:.0f} | {k['pct_copy']:.1f} | {k['pct_same_bytes_copy']:.1f} |")
        print(lines[-1], flush=True)
    print(write_results("rms_norm", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
