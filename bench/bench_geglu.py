"""GEGLU epilogue at SD1.5 feed-forward shapes: torch (chunk, gelu, mul) vs rocm_sd::geglu.

    python bench/bench_geglu.py [--out-dir bench/results] [--dtype float16]

Bytes counted: one read of x (rows x 2D) and one write of y (rows x D), the least any implementation moves.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import compare_with_torch, kernel_bench_args, rotating_inputs  # noqa: E402
from rocm_sd.ops.geglu import geglu_kernel, geglu_ref, supports  # noqa: E402
from tests.shapes import GEGLU_SD  # noqa: E402


def setup(shape, dtype):
    inputs = rotating_inputs(lambda: torch.randn(shape, device="cuda", dtype=dtype), torch.Size(shape).numel() * 2)
    return inputs, geglu_ref, geglu_kernel, supports(inputs[0])


if __name__ == "__main__":
    compare_with_torch("geglu", kernel_bench_args(__doc__), GEGLU_SD, setup,
                       lambda shape, dtype: torch.Size(shape).numel() * dtype.itemsize * 3 // 2)
