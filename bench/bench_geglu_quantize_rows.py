"""The quantizing GEGLU kernels at SD feed-forward shapes, torch (chunk, gelu, mul, then the per-row quantization) vs
rocm_sd:
  --op geglu_quantize_rows (default)  the GEGLU epilogue writing y and y's per-row 8-bit quantization
                                      (optimize(precision=...)'s fused path)
  --op geglu_quantized                the same rows without y (the feed-forward's path once its output layer runs
                                      8-bit for good)

    python bench/bench_geglu_quantize_rows.py [--op geglu_quantized] [--out-dir bench/results] [--dtype float16]
                                              [--format e4m3fn] [--bound 8]

--bound: one scale for every row (precision_scales="tensor"), which takes the elementwise kernel instead of the row
blocks.

Bytes counted: one read of x (rows x 2D), one write of q (rows x D bytes) and, for geglu_quantize_rows, of y
(rows x D); the scales are noise.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import compare_with_torch, kernel_bench_args, rotating_inputs  # noqa: E402
from rocm_sd.ops.quantize import FORMATS  # noqa: E402
from rocm_sd.ops.quantized_outputs import GEGLU_OP, GEGLU_QUANTIZED_OP, GEGLU_QUANTIZED_SPEC, GEGLU_SPEC  # noqa: E402
from tests.shapes import GEGLU_SD  # noqa: E402

SPECS = {GEGLU_OP: GEGLU_SPEC, GEGLU_QUANTIZED_OP: GEGLU_QUANTIZED_SPEC}


def add_arguments(parser) -> None:
    parser.add_argument("--op", default=GEGLU_OP, choices=list(SPECS))
    parser.add_argument("--format", default="e4m3fn", choices=list(FORMATS))
    parser.add_argument("--bound", type=float, default=0.0)


if __name__ == "__main__":
    args = kernel_bench_args(__doc__, add_arguments)
    spec = SPECS[args.op]
    writes_y = args.op == GEGLU_OP

    def setup(shape, dtype):
        inputs = rotating_inputs(lambda: torch.randn(shape, device="cuda", dtype=dtype),
                                 torch.Size(shape).numel() * 2)
        return (inputs, lambda x: spec.reference(x, args.format, args.bound),
                lambda x: spec.kernel(x, args.format, args.bound), spec.supports(inputs[0], args.format, args.bound))

    def bytes_moved(shape, dtype):
        elements = torch.Size(shape).numel()  # of x; y and q have half as many
        return elements * dtype.itemsize * (3 if writes_y else 2) // 2 + elements // 2

    compare_with_torch(args.op + ("-bound" if args.bound else ""), args, GEGLU_SD, setup, bytes_moved)
