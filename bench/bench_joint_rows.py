"""The joint attention's projections, per shape: the streams' rows concatenated and reshaped by copies (eager), or
written and read in place by one GEMM a batch (modules/joint_rows.py).

    python bench/bench_joint_rows.py [--out-dir bench/results] [--dtype bfloat16]

Per model, at 1024x1024 (SD3.5 Large with its CFG batch of 2, Flux dev with 1):
  v join      to_v and add_v_proj, then torch.cat          | joint_linear: both GEMMs write the joint V
  qkv fp8     fuse_qkv's 8-bit to_qkv / to_added_qkv, V joined by two strided copies | joint_qkv
  to_out      to_out on the image rows of the attention output (a reshape copy, then the GEMM) | linear_rows
Device ms from graph replays over rotating inputs.
"""
from __future__ import annotations

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import device_ms, kernel_bench_args, rotating_inputs, write_results  # noqa: E402
from rocm_sd.modules.joint_rows import joined, joint_linear, joint_qkv, linear_rows  # noqa: E402
from rocm_sd.modules.quantized_linear import RocmQuantizedLinear  # noqa: E402

# (name, batch, image rows, text rows, width, image rows first)
MODELS = [("SD3.5 Large", 2, 4096, 333, 2432, True), ("Flux dev", 1, 4096, 512, 3072, False)]


def _streams(batch, image, text, width, dtype):
    return lambda: (torch.randn(batch, image, width, device="cuda", dtype=dtype),
                    torch.randn(batch, text, width, device="cuda", dtype=dtype))


def measure_model(name, batch, image, text, width, image_first, dtype) -> list[dict]:
    rows = []
    make = _streams(batch, image, text, width, dtype)
    inputs = rotating_inputs(make, batch * (image + text) * width * dtype.itemsize)
    order = (lambda i, t: (i, t)) if image_first else (lambda i, t: (t, i))
    to_v, add_v = (nn.Linear(width, width, device="cuda", dtype=dtype) for _ in range(2))
    v_paths = {
        "eager": lambda xs: torch.cat([layer(x) for layer, x in zip(order(to_v, add_v), order(*xs))], dim=1),
        "in place": lambda xs: joint_linear(order(to_v, add_v)[0], order(*xs)[0], order(to_v, add_v)[1],
                                            order(*xs)[1]),
    }
    to_qkv, add_qkv = (RocmQuantizedLinear.from_module(nn.Linear(width, 3 * width, device="cuda", dtype=dtype),
                                                       "e4m3fn") for _ in range(2))

    def qkv_eager(xs):
        first, second = (layer(x).chunk(3, -1) for layer, x in zip(order(to_qkv, add_qkv), order(*xs)))
        return joined(first[2], second[2])

    qkv_paths = {"eager": qkv_eager,
                 "in place": lambda xs: joint_qkv(order(to_qkv, add_qkv)[0], order(*xs)[0],
                                                  order(to_qkv, add_qkv)[1], order(*xs)[1])}
    to_out = nn.Linear(width, width, device="cuda", dtype=dtype)
    joint_outputs = rotating_inputs(lambda: torch.randn(batch, image + text, width, device="cuda", dtype=dtype),
                                    batch * (image + text) * width * dtype.itemsize)
    image_rows = (lambda y: y[:, :image]) if image_first else (lambda y: y[:, text:])
    out_paths = {"eager": lambda y: to_out(image_rows(y)), "in place": lambda y: linear_rows(to_out, image_rows(y))}
    with torch.no_grad():
        for what, paths, data in (("v join", v_paths, inputs), ("qkv fp8", qkv_paths, inputs),
                                  ("to_out", out_paths, joint_outputs)):
            times = {path: device_ms(fn, data) for path, fn in paths.items()}
            rows.append({"model": name, "what": what, "batch": batch, "image_rows": image, "text_rows": text,
                         "width": width, "dtype": str(dtype).removeprefix("torch."),
                         "eager_ms": round(times["eager"], 4), "in_place_ms": round(times["in place"], 4)})
    return rows


def main() -> None:
    args = kernel_bench_args(__doc__)
    dtype = getattr(torch, args.dtype)
    rows = []
    lines = ["Device ms per call (graph replays, rotating inputs).", "",
             "| model | step | batch | eager | in place | speed-up |", "|---|---|---:|---:|---:|---:|"]
    for model in MODELS:
        for row in measure_model(*model, dtype):
            rows.append(row)
            lines.append(f"| {row['model']} | {row['what']} | {row['batch']} | {row['eager_ms']:.3f} | "
                         f"{row['in_place_ms']:.3f} | {row['eager_ms'] / row['in_place_ms']:.2f}x |")
            print(lines[-1], flush=True)
    print(write_results("joint_rows", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
