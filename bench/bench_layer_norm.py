"""LayerNorm at SD transformer shapes: torch.nn.functional.layer_norm vs rocm_sd::layer_norm, and the
residual form (the transformer block's "h = a + h; norm(h)"): torch's add then layer_norm vs
rocm_sd::add_layer_norm.

    python bench/bench_layer_norm.py [--out-dir bench/results] [--dtype float16]

Bytes counted: layer_norm one read of x and one write of y; add_layer_norm two reads (x, residual) and
two writes (sum, y), the least either form must move.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import compare_with_torch, kernel_bench_args, rotating_inputs  # noqa: E402
from rocm_sd.ops.layer_norm import (add_layer_norm_kernel, add_layer_norm_ref, add_layer_norm_supports,  # noqa: E402
                                    layer_norm_kernel, layer_norm_ref, supports)
from tests.shapes import LAYER_NORM_SD  # noqa: E402


def setup(shape, dtype):
    inputs = rotating_inputs(lambda: torch.randn(shape, device="cuda", dtype=dtype), torch.Size(shape).numel() * 2)
    w = torch.rand(shape[-1], device="cuda", dtype=dtype) + 0.5
    b = torch.randn(shape[-1], device="cuda", dtype=dtype)
    return (inputs, lambda x: layer_norm_ref(x, w, b, 1e-5), lambda x: layer_norm_kernel(x, w, b, 1e-5),
            supports(inputs[0], w, b, 1e-5))


def setup_add(shape, dtype):
    def make():
        return torch.randn(shape, device="cuda", dtype=dtype), torch.randn(shape, device="cuda", dtype=dtype)

    inputs = rotating_inputs(make, torch.Size(shape).numel() * 4)
    w = torch.rand(shape[-1], device="cuda", dtype=dtype) + 0.5
    b = torch.randn(shape[-1], device="cuda", dtype=dtype)
    return (inputs, lambda xr: add_layer_norm_ref(*xr, w, b, 1e-5), lambda xr: add_layer_norm_kernel(*xr, w, b, 1e-5),
            add_layer_norm_supports(*inputs[0], w, b, 1e-5))


if __name__ == "__main__":
    args = kernel_bench_args(__doc__)
    compare_with_torch("layer_norm", args, LAYER_NORM_SD, setup,
                       lambda shape, dtype: torch.Size(shape).numel() * dtype.itemsize * 2)
    compare_with_torch("add_layer_norm", args, LAYER_NORM_SD, setup_add,
                       lambda shape, dtype: torch.Size(shape).numel() * dtype.itemsize * 4)
