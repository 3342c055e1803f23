"""NCHW <-> channels_last copies at SD shapes: torch's strided copy (`.contiguous(memory_format=...)`) vs
rocm_sd::layout_copy (a batched register transpose with 16-byte vectors on both sides).

    python bench/bench_layout_copy.py [--out-dir bench/results] [--dtype float16]

Shapes are (direction, (N, C, H, W)): the UNet's activations at 64x64 and 8x8, the VAE decoder's largest, the
latents and the decoded image, both directions. Bytes counted: one read and one write of the tensor.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import compare_with_torch, kernel_bench_args, rotating_inputs  # noqa: E402
from rocm_sd.ops.layout_copy import layout_copy_kernel, layout_copy_ref, supports  # noqa: E402

SIZES = [(2, 320, 64, 64), (2, 1280, 8, 8), (1, 512, 128, 128), (1, 256, 256, 256), (1, 128, 512, 512),
         (2, 4, 64, 64), (1, 3, 512, 512)]
SHAPES = [(direction, size) for size in SIZES for direction in ("to_nhwc", "to_nchw")]


def setup(shape, dtype):
    direction, size = shape
    to_channels_last = direction == "to_nhwc"

    def make():
        x = torch.randn(size, device="cuda", dtype=dtype)
        return x if to_channels_last else x.contiguous(memory_format=torch.channels_last)

    inputs = rotating_inputs(make, torch.Size(size).numel() * dtype.itemsize)
    return (inputs, lambda x: layout_copy_ref(x, to_channels_last), lambda x: layout_copy_kernel(x, to_channels_last),
            supports(inputs[0], to_channels_last))


if __name__ == "__main__":
    compare_with_torch("layout_copy", kernel_bench_args(__doc__), SHAPES, setup,
                       lambda shape, dtype: 2 * torch.Size(shape[1]).numel() * dtype.itemsize)
