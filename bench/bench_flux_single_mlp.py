"""ComfyUI's Flux single block between its norm and its gated residual, without the attention: linear1 (qkv and the
MLP side by side), the MLP's GELU(tanh) and linear2 of [attention, MLP] (modules/comfy_dit.py's _single_linear1 /
_single_linear2), per way of running it.

    python bench/bench_flux_single_mlp.py [--out-dir bench/results] [--dtype bfloat16]

16-bit:
  comfyui       linear1, F.gelu of its MLP columns, torch.cat([attention, MLP]), linear2 (ComfyUI's own forward);
  whole         linear1, F.gelu of its MLP columns, linear2 as two GEMMs into one output (rocm_sd before the split);
  split         linear1 as two GEMMs, the MLP's with its bias + GELU in the GEMM's epilogue, linear2 as two GEMMs.
8-bit (e4m3fn, row-wise scales; linear1's input rows as the AdaLN writes them):
  fp8 whole     linear1's 8-bit GEMM, F.gelu of its MLP columns, torch.cat, linear2 quantizing the concatenation;
  fp8 split     linear1 as two 8-bit GEMMs of the same rows, gelu_tanh_quantized writing linear2's MLP rows, the
                attention's rows quantized, linear2 as two 8-bit GEMMs of column blocks of its weight, summed.
Flux dev at 1024x1024: 4608 rows (512 text + 4096 image), width 3072, MLP 12288. Device ms from graph replays over
rotating inputs.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rocm_sd  # noqa: E402
from rocm_sd import config  # noqa: E402
from bench.harness import device_ms, kernel_bench_args, rotating_inputs, write_results  # noqa: E402
from rocm_sd.modules.mmdit import addmm_gelu_tanh, split_proj_out  # noqa: E402
from rocm_sd.modules.mmdit_8bit import gelu_for  # noqa: E402
from rocm_sd.modules.quantized_linear import (EightBit, forward_8bit, forward_8bit_blocks,  # noqa: E402
                                              forward_8bit_parts, quantize_weight, rows_stand_in)
from rocm_sd.ops.quantize import quantize_rows  # noqa: E402

ROWS, WIDTH, MLP = 4608, 3072, 12288
FP8 = "e4m3fn"


def measure(dtype) -> dict:
    qkv_width = 3 * WIDTH
    linear1 = torch.nn.Linear(WIDTH, qkv_width + MLP, device="cuda", dtype=dtype)
    linear2 = torch.nn.Linear(WIDTH + MLP, WIDTH, device="cuda", dtype=dtype)
    for layer in (linear1, linear2):
        layer.requires_grad_(False)
    inputs = rotating_inputs(lambda: (torch.randn(1, ROWS, WIDTH, device="cuda", dtype=dtype),
                                      torch.randn(1, ROWS, WIDTH, device="cuda", dtype=dtype)),
                             ROWS * (2 * WIDTH + qkv_width + 2 * MLP) * dtype.itemsize)
    w1, b1 = linear1.weight, linear1.bias

    def comfyui(xs):
        x, attention = xs
        qkv, mlp = torch.split(linear1(x), [qkv_width, MLP], dim=-1)
        return qkv, linear2(torch.cat((attention, F.gelu(mlp, approximate="tanh")), 2))

    def whole(xs):
        x, attention = xs
        qkv, mlp = torch.split(linear1(x), [qkv_width, MLP], dim=-1)
        return qkv, split_proj_out(linear2, attention, F.gelu(mlp, approximate="tanh"))

    def split(xs):
        x, attention = xs
        qkv = F.linear(x, w1[:qkv_width], b1[:qkv_width])
        return qkv, split_proj_out(linear2, attention, addmm_gelu_tanh(x, w1[qkv_width:], b1[qkv_width:]))

    one = EightBit(WIDTH, *quantize_weight(w1, FP8), b1, FP8)
    two = EightBit(WIDTH + MLP, *quantize_weight(linear2.weight, FP8), linear2.bias, FP8)
    blocks = [one.output_block(0, qkv_width), one.output_block(qkv_width, qkv_width + MLP)]
    halves = [two.input_block(0, WIDTH), two.input_block(WIDTH, WIDTH + MLP)]
    quantized = [(*quantize_rows.call(x.view(ROWS, WIDTH), FP8), attention) for x, attention in inputs]

    def normed(q, scale):  # the AdaLN's 8-bit rows for linear1, as modules/mmdit_8bit.modulated returns them
        return rows_stand_in(torch.Size((1, ROWS, WIDTH)), dtype, FP8, q, scale)

    def fp8_whole(qs):
        q, scale, attention = qs
        qkv, mlp = torch.split(forward_8bit(normed(q, scale), False, WIDTH, *one[1:]), [qkv_width, MLP], dim=-1)
        both = torch.cat((attention, F.gelu(mlp, approximate="tanh")), 2)
        return qkv, forward_8bit(both, False, WIDTH + MLP, *two[1:])

    def fp8_split(qs):
        q, scale, attention = qs
        qkv, pre = forward_8bit_blocks(normed(q, scale), blocks)
        return qkv, forward_8bit_parts([attention, gelu_for(pre, halves[1])], halves)

    with config.override(strict=True), torch.no_grad():
        times = {name: device_ms(fn, inputs) for name, fn in
                 (("comfyui", comfyui), ("whole", whole), ("split", split))}
        times.update({name: device_ms(fn, quantized) for name, fn in (("fp8 whole", fp8_whole),
                                                                        ("fp8 split", fp8_split))})
        agree = {"split": _error(split(inputs[0])[1], whole(inputs[0])[1]),
                 "fp8_split": _error(fp8_split(quantized[0])[1], whole(inputs[0])[1]),
                 "fp8_whole": _error(fp8_whole(quantized[0])[1], whole(inputs[0])[1])}
    ran = rocm_sd.stats()
    assert all(ran.get(op, {}).keys() <= {"rocm_sd"} for op in ("gelu_tanh_quantized", "quantize_rows"))
    return {"model": "Flux dev single block", "rows": ROWS, "width": WIDTH, "mlp": MLP,
            "dtype": str(dtype).removeprefix("torch."),
            **{name.replace(" ", "_") + "_ms": round(ms, 4) for name, ms in times.items()},
            **{f"{name}_error_vs_whole": round(e, 5) for name, e in agree.items()}}


def _error(got: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest absolute difference over the reference's largest magnitude."""
    return ((got.float() - reference.float()).abs().max() / reference.float().abs().max()).item()


def main() -> None:
    args = kernel_bench_args(__doc__)
    row = measure(getattr(torch, args.dtype))
    lines = ["Device ms per call (graph replays, rotating inputs).", "",
             "| block | comfyui | whole | split | split vs whole | fp8 whole | fp8 split | fp8 split vs whole |",
             "|---|---:|---:|---:|---:|---:|---:|---:|",
             f"| {row['model']} ({row['rows']} rows, {row['dtype']}) | {row['comfyui_ms']:.3f} | "
             f"{row['whole_ms']:.3f} | "
             f"{row['split_ms']:.3f} | {row['whole_ms'] / row['split_ms']:.2f}x | {row['fp8_whole_ms']:.3f} | "
             f"{row['fp8_split_ms']:.3f} | {row['fp8_whole_ms'] / row['fp8_split_ms']:.2f}x |", "",
             f"Max error against `whole` (over its max magnitude): split {row['split_error_vs_whole']}, fp8 whole "
             f"{row['fp8_whole_error_vs_whole']}, fp8 split {row['fp8_split_error_vs_whole']}."]
    print(write_results("flux_single_mlp", [row], "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
