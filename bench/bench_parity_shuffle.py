"""The folded upsampling's pixel shuffle with bias at SD shapes: torch (four strided copies, then the bias)
vs rocm_sd::parity_shuffle (one pass).

    python bench/bench_parity_shuffle.py [--out-dir bench/results] [--dtype float16]

Shapes are (N, C, H, W): output channels and input resolution of the SD UNet's and VAE decoder's upsamplers.
Bytes counted: one read of the parities, one write of the output.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import compare_with_torch, kernel_bench_args, rotating_inputs  # noqa: E402
from rocm_sd.ops.parity_shuffle import parity_shuffle_kernel, parity_shuffle_ref, supports  # noqa: E402

SHAPES = [(2, 1280, 16, 16), (2, 640, 32, 32), (1, 512, 128, 128), (1, 512, 256, 256), (1, 256, 512, 512)]


def parity_bytes(shape, dtype) -> int:
    n, c, h, w = shape
    return n * 4 * c * (h + 1) * (w + 1) * dtype.itemsize


def setup(shape, dtype):
    n, c, h, w = shape

    def make():
        return torch.randn(n, 4 * c, h + 1, w + 1, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)

    inputs = rotating_inputs(make, parity_bytes(shape, dtype))
    bias = torch.randn(c, device="cuda", dtype=dtype)
    return (inputs, lambda p: parity_shuffle_ref(p, bias), lambda p: parity_shuffle_kernel(p, bias),
            supports(inputs[0], bias))


if __name__ == "__main__":
    compare_with_torch("parity_shuffle", kernel_bench_args(__doc__), SHAPES, setup,
                       lambda shape, dtype: parity_bytes(shape, dtype) + shape[0] * shape[1] * 4 * shape[2] * shape[3]
                       * dtype.itemsize)
