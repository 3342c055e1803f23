"""The row kernels with and without their quantized output (optimize(precision=...)'s fused path): device time per
call (microseconds, from a CUDA graph of 20 calls, as bench_quantized_linear.py) of LayerNorm, SkipLayerNorm and
GEGLU alone, writing fp8 / int8 rows too, and alone followed by a separate quantize_rows, at SDXL 1024 and SD1.5 512
shapes (batch 2 with CFG). What the fused path costs over fp16's kernels, and what fusing saves over a second pass.
The second table: with a bound (one scale for the tensor, the shipped fp8 path), the fused kernels writing y too
against writing only the quantized rows (the `_quantized` ops: a producer whose every consumer takes the rows).

    python bench/bench_quantized_outputs.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.bench_quantized_linear import device_us  # noqa: E402
from rocm_sd.ops.geglu import geglu_kernel  # noqa: E402
from rocm_sd.ops.layer_norm import add_layer_norm_kernel, layer_norm_kernel  # noqa: E402
from rocm_sd.ops.quantize import quantize_rows_kernel  # noqa: E402
from rocm_sd.ops.quantized_outputs import (add_layer_norm_quantize_rows_kernel, add_layer_norm_quantized_kernel,  # noqa: E402
                                           geglu_quantize_rows_kernel, geglu_quantized_kernel,
                                           layer_norm_quantize_rows_kernel, layer_norm_quantized_kernel)

NORM_ROWS = [(8192, 320), (8192, 640), (2048, 1280), (8192, 1280)]   # (rows, channels)
GEGLU_ROWS = [(8192, 1280), (8192, 2560), (2048, 5120)]              # (rows, D): input rows of 2D


def row(op, shape, plain, fused, separate):
    cells = [plain(), fused("e4m3fn"), fused("int8"), separate()]
    text = " | ".join(f"{v:.1f}" for v in cells)
    print(f"| {op} | {shape[0]} x {shape[1]} | {text} | {cells[1] / cells[0]:.2f} |", flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: no GPU visible to torch {torch.__version__}; kernel benchmarks time a GPU")
    torch.manual_seed(0)
    print("| op | rows x C | plain | fp8 fused | int8 fused | plain + quantize_rows fp8 | fp8 fused vs plain |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for rows, c in NORM_ROWS:
        x = torch.randn(rows, c, device="cuda", dtype=torch.float16)
        r, w = torch.randn_like(x), torch.randn(c, device="cuda", dtype=torch.float16)
        b = torch.randn_like(w)
        row("layer_norm", (rows, c), lambda: device_us(lambda: layer_norm_kernel(x, w, b, 1e-5)),
            lambda f: device_us(lambda: layer_norm_quantize_rows_kernel(x, w, b, 1e-5, f)),
            lambda: device_us(lambda: quantize_rows_kernel(layer_norm_kernel(x, w, b, 1e-5), "e4m3fn")))
        row("add_layer_norm", (rows, c), lambda: device_us(lambda: add_layer_norm_kernel(x, r, w, b, 1e-5)),
            lambda f: device_us(lambda: add_layer_norm_quantize_rows_kernel(x, r, w, b, 1e-5, f)),
            lambda: device_us(lambda: quantize_rows_kernel(add_layer_norm_kernel(x, r, w, b, 1e-5)[1], "e4m3fn")))
    for rows, d in GEGLU_ROWS:
        x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.float16)
        row("geglu", (rows, d), lambda: device_us(lambda: geglu_kernel(x)),
            lambda f: device_us(lambda: geglu_quantize_rows_kernel(x, f)),
            lambda: device_us(lambda: quantize_rows_kernel(geglu_kernel(x), "e4m3fn")))

    print()
    print("With a bound (e4m3fn, one scale):")
    print("| op | rows x C | plain | fp8 with y | fp8 rows only | rows only vs plain |")
    print("|---|---|---:|---:|---:|---:|")

    def bounded_row(op, shape, plain, with_y, rows_only):
        cells = [plain(), with_y(), rows_only()]
        text = " | ".join(f"{v:.1f}" for v in cells)
        print(f"| {op} | {shape[0]} x {shape[1]} | {text} | {cells[2] / cells[0]:.2f} |", flush=True)

    for rows, c in NORM_ROWS:
        x = torch.randn(rows, c, device="cuda", dtype=torch.float16)
        r, w = torch.randn_like(x), torch.randn(c, device="cuda", dtype=torch.float16)
        b = torch.randn_like(w)
        bounded_row("layer_norm", (rows, c), lambda: device_us(lambda: layer_norm_kernel(x, w, b, 1e-5)),
                    lambda: device_us(lambda: layer_norm_quantize_rows_kernel(x, w, b, 1e-5, "e4m3fn", 8.0)),
                    lambda: device_us(lambda: layer_norm_quantized_kernel(x, w, b, 1e-5, "e4m3fn", 8.0)))
        bounded_row("add_layer_norm", (rows, c), lambda: device_us(lambda: add_layer_norm_kernel(x, r, w, b, 1e-5)),
                    lambda: device_us(lambda: add_layer_norm_quantize_rows_kernel(x, r, w, b, 1e-5, "e4m3fn", 8.0)),
                    lambda: device_us(lambda: add_layer_norm_quantized_kernel(x, r, w, b, 1e-5, "e4m3fn", 8.0)))
    for rows, d in GEGLU_ROWS:
        x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.float16)
        bounded_row("geglu", (rows, d), lambda: device_us(lambda: geglu_kernel(x)),
                    lambda: device_us(lambda: geglu_quantize_rows_kernel(x, "e4m3fn", 8.0)),
                    lambda: device_us(lambda: geglu_quantized_kernel(x, "e4m3fn", 8.0)))
