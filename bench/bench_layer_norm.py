"""LayerNorm at SD transformer shapes: torch.nn.functional.layer_norm vs rocm_sd::layer_norm.

    python bench/bench_layer_norm.py [--out-dir bench/results] [--dtype float16]

Bytes counted: one read of x and one write of y.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import compare_with_torch, kernel_bench_args, rotating_inputs  # noqa: E402
from rocm_sd.ops.layer_norm import layer_norm_kernel, layer_norm_ref, supports  # noqa: E402
from tests.shapes import LAYER_NORM_SD  # noqa: E402


def setup(shape, dtype):
    inputs = rotating_inputs(lambda: torch.randn(shape, device="cuda", dtype=dtype), torch.Size(shape).numel() * 2)
    w = torch.rand(shape[-1], device="cuda", dtype=dtype) + 0.5
    b = torch.randn(shape[-1], device="cuda", dtype=dtype)
    return (inputs, lambda x: layer_norm_ref(x, w, b, 1e-5), lambda x: layer_norm_kernel(x, w, b, 1e-5),
            supports(inputs[0], w, b, 1e-5))


if __name__ == "__main__":
    compare_with_torch("layer_norm", kernel_bench_args(__doc__), LAYER_NORM_SD, setup,
                       lambda shape, dtype: torch.Size(shape).numel() * dtype.itemsize * 2)
