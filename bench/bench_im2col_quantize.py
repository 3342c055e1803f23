"""rocm_sd::im2col_quantize at SD's 3x3 convolution inputs (batch 2: one image with CFG), and with --layer the whole
FP8 convolution (modules/quantized_conv.py: the patches, then the per-tensor FP8 GEMM with bias) against the fp16
convolution (cuDNN / MIOpen, channels_last, as the pipeline runs it).

    python bench/bench_im2col_quantize.py [--layer] [--format e4m3fn] [--out-dir bench/results]

Bytes counted for the kernel: one read of x and one write of the patches (9 bytes per input element).
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import compare_with_torch, device_ms, kernel_bench_args, rotating_inputs, write_results  # noqa: E402
from rocm_sd.modules.quantized_conv import GroupNormBound, RocmQuantizedConv2d  # noqa: E402
from rocm_sd.ops.im2col_quantize import FP8_FORMATS, SPEC  # noqa: E402

# (N, C, H, W, out channels): SDXL 1024's resnet convolutions at each level, the up blocks' concatenated inputs too;
# SD1.5 512's 320-channel level.
SHAPES = [(2, 320, 128, 128, 320), (2, 960, 128, 128, 320), (2, 640, 64, 64, 640), (2, 1920, 64, 64, 640),
          (2, 1280, 32, 32, 1280), (2, 2560, 32, 32, 1280), (2, 320, 64, 64, 320)]
BOUND = 64.0


def add_arguments(parser) -> None:
    parser.add_argument("--format", default="e4m3fn", choices=list(FP8_FORMATS))
    parser.add_argument("--layer", action="store_true", help="time the whole FP8 convolution against fp16's")


def inputs_for(shape, dtype):
    n, c, h, w, _ = shape
    return rotating_inputs(lambda: torch.randn(n, c, h, w, device="cuda", dtype=dtype)
                           .contiguous(memory_format=torch.channels_last), n * c * h * w * 2)


def layers(args) -> None:
    dtype = getattr(torch, args.dtype)
    rows, lines = [], ["| N, C, H, W -> out | fp16 convolution ms | FP8 convolution ms | speed-up |",
                       "|---|---:|---:|---:|"]
    for shape in SHAPES:
        n, c, h, w, out = shape
        conv = nn.Conv2d(c, out, 3, padding=1).to("cuda", dtype).to(memory_format=torch.channels_last)
        layer = RocmQuantizedConv2d(conv, args.format, GroupNormBound(c // 32, 1.0, 0.0)).cuda()
        xs = inputs_for(shape, dtype)
        with torch.no_grad():
            fp16, fp8 = device_ms(conv, xs), device_ms(layer, xs)
        rows.append({"op": "conv_8bit", "shape": str(shape), "dtype": args.dtype, "format": args.format,
                     "fp16_ms": round(fp16, 4), "fp8_ms": round(fp8, 4), "speedup": round(fp16 / fp8, 3)})
        lines.append(f"| {shape} | {fp16:.4f} | {fp8:.4f} | {fp16 / fp8:.2f}x |")
        print(lines[-1], flush=True)
    print(write_results("conv_8bit", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    args = kernel_bench_args(__doc__, add_arguments)
    if args.layer:
        layers(args)
        raise SystemExit(0)

    def setup(shape, dtype):
        inputs = inputs_for(shape, dtype)
        call = (args.format, BOUND, 3, 3, 1, 1, 1, 1)
        return (inputs, lambda x: SPEC.reference(x, *call), lambda x: SPEC.kernel(x, *call),
                SPEC.supports(inputs[0], *call))

    def bytes_moved(shape, dtype):
        n, c, h, w, _ = shape
        return n * c * h * w * (dtype.itemsize + 9)

    compare_with_torch(SPEC.name, args, SHAPES, setup, bytes_moved)
