"""geglu_quantized at SD feed-forward shapes: the GEGLU epilogue writing only its output's per-row 8-bit quantization
(the feed-forward's path once its output layer runs 8-bit for good), torch (chunk, gelu, mul, then the per-row
quantization) vs rocm_sd::geglu_quantized.

    python bench/bench_geglu_quantized.py [--out-dir bench/results] [--dtype float16] [--format e4m3fn]

Bytes counted: one read of x (rows x 2D) and one write of q (rows x D bytes); the scales are noise.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import compare_with_torch, kernel_bench_args, rotating_inputs  # noqa: E402
from rocm_sd.ops.quantize import FORMATS  # noqa: E402
from rocm_sd.ops.quantized_outputs import (GEGLU_QUANTIZED_SPEC, geglu_quantized_kernel,  # noqa: E402
                                           geglu_quantized_ref)
from tests.shapes import GEGLU_SD  # noqa: E402

if __name__ == "__main__":
    args = kernel_bench_args(__doc__, lambda parser: parser.add_argument("--format", default="e4m3fn",
                                                                          choices=list(FORMATS)))

    def setup(shape, dtype):
        inputs = rotating_inputs(lambda: torch.randn(shape, device="cuda", dtype=dtype),
                                 torch.Size(shape).numel() * 2)
        return (inputs, lambda x: geglu_quantized_ref(x, args.format),
                lambda x: geglu_quantized_kernel(x, args.format), GEGLU_QUANTIZED_SPEC.supports(inputs[0], args.format))

    compare_with_torch("geglu_quantized", args, GEGLU_SD, setup,
                       lambda shape, dtype: torch.Size(shape).numel() * dtype.itemsize + torch.Size(shape).numel() // 2)
