"""The diffusion transformers' feed-forward projection + GELU(tanh), per shape: where the activation runs.

    python bench/bench_gelu_tanh.py [--out-dir bench/results] [--dtype bfloat16]

16-bit, three ways of computing gelu(x @ W.T + b, approximate="tanh"):
  eager     F.linear, then F.gelu (diffusers' GELU module): the GEMM writes its output, a second pass reads it;
  epilogue  torch._addmm_activation(use_gelu=True): the bias and GELU in cuBLASLt's / hipBLASLt's epilogue
            (modules/mmdit.py's linear_gelu_tanh, rocm_sd's default);
  rocm_sd   the GEMM without its bias, then rocm_sd::gelu_tanh (bias + GELU in one pass): the fallback where the
            vendor GEMM has no such epilogue.
8-bit (e4m3fn, row-wise scales: precision="fp8"), the projection's output feeding the 8-bit output projection:
  fp8 unfused   torch._scaled_mm (+bias), F.gelu, rocm_sd::quantize_rows of the GELU's output;
  fp8 rocm_sd   torch._scaled_mm (+bias), rocm_sd::gelu_tanh_quantized (the GELU writes only the 8-bit rows).
Shapes (M, K, N) are the first feed-forward GEMMs at 1024x1024: SD3.5 Large (CFG batch 2) image and text streams,
SD3.5 Medium's image stream, Flux dev's image and text streams and its single blocks' proj_mlp. Device ms from graph
replays over rotating inputs.
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
from rocm_sd.ops.gelu_tanh import gelu_tanh, gelu_tanh_quantized  # noqa: E402
from rocm_sd.ops.quantize import quantize_rows, quantize_rows_ref  # noqa: E402

SHAPES = [("SD3.5 Large image", (8192, 2432, 9728)), ("SD3.5 Large text", (666, 2432, 9728)),
          ("SD3.5 Medium image", (8192, 1536, 6144)), ("Flux image", (4096, 3072, 12288)),
          ("Flux text", (512, 3072, 12288)), ("Flux single proj_mlp", (4608, 3072, 12288))]
FP8 = "e4m3fn"


def measure_shape(name, shape, dtype) -> dict:
    m, k, n = shape
    weight = torch.randn(n, k, device="cuda", dtype=dtype) * k ** -0.5
    bias = torch.randn(n, device="cuda", dtype=dtype)
    inputs = rotating_inputs(lambda: torch.randn(m, k, device="cuda", dtype=dtype), m * (k + n) * dtype.itemsize)
    w_t = weight.t()
    paths = {
        "eager": lambda x: F.gelu(F.linear(x, weight, bias), approximate="tanh"),
        "epilogue": lambda x: torch._addmm_activation(bias, x, w_t, use_gelu=True),
        "rocm_sd": lambda x: gelu_tanh(x @ w_t, bias),
    }
    w_q, w_scale = quantize_rows_ref(weight, FP8)
    w_q_t, w_scale = w_q.t(), w_scale.view(1, n)
    quantized = [(*quantize_rows.call(x, FP8),) for x in inputs]

    def fp8_gemm(qx):
        q, scale = qx
        return torch._scaled_mm(q, w_q_t, scale_a=scale.view(-1, 1), scale_b=w_scale, bias=bias, out_dtype=dtype,
                                use_fast_accum=True)

    fp8_paths = {
        "fp8 unfused": lambda qx: quantize_rows.call(F.gelu(fp8_gemm(qx), approximate="tanh"), FP8),
        "fp8 rocm_sd": lambda qx: gelu_tanh_quantized(fp8_gemm(qx), None, FP8),
    }
    with config.override(strict=True):
        times = {path: device_ms(fn, inputs) for path, fn in paths.items()}
        times.update({path: device_ms(fn, quantized) for path, fn in fp8_paths.items()})
        # the activations alone, the GEMM's output as their input
        outputs = [x @ w_t for x in inputs[:4]]
        times["gelu_tanh alone"] = device_ms(lambda y: gelu_tanh(y, bias), outputs)
        times["F.gelu alone"] = device_ms(lambda y: F.gelu(y + bias, approximate="tanh"), outputs)
    ran = rocm_sd.stats()
    assert ran.get("gelu_tanh", {}).keys() <= {"rocm_sd"} and ran.get("gelu_tanh_quantized", {}).keys() <= {"rocm_sd"}
    return {"model": name, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."),
            **{path.replace(" ", "_") + "_ms": round(ms, 4) for path, ms in times.items()}}


def main() -> None:
    args = kernel_bench_args(__doc__)
    dtype = getattr(torch, args.dtype)
    rows = []
    lines = ["Device ms per call (graph replays, rotating inputs).", "",
             "| layer | M, K, N | eager | epilogue | rocm_sd (mm + gelu_tanh) | best 16-bit | fp8 unfused | fp8 rocm_sd | "
             "fp8 speed-up | gelu_tanh alone | F.gelu alone |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for name, shape in SHAPES:
        row = measure_shape(name, shape, dtype)
        rows.append(row)
        best = min(("eager", "epilogue", "rocm_sd"), key=lambda p: row[f"{p}_ms"])
        lines.append(f"| {name} | {', '.join(map(str, shape))} | {row['eager_ms']:.3f} | {row['epilogue_ms']:.3f} | "
                     f"{row['rocm_sd_ms']:.3f} | {best} | {row['fp8_unfused_ms']:.3f} | {row['fp8_rocm_sd_ms']:.3f} | "
                     f"{row['fp8_unfused_ms'] / row['fp8_rocm_sd_ms']:.2f}x | {row['gelu_tanh_alone_ms']:.3f} | "
                     f"{row['F.gelu_alone_ms']:.3f} |")
        print(lines[-1], flush=True)
    print(write_results("gelu_tanh", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
