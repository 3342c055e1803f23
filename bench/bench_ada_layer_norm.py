"""The AdaLN-Zero modulation at diffusion-transformer shapes (SD3.5 Large, SD3 / SD3.5 Medium, Flux): PyTorch eager's
op sequence (diffusers' `norm(x) * (1 + scale[:, None]) + shift[:, None]`), torch.compile of that reference and
rocm_sd::ada_layer_norm; and the gated-residual form (`h = x + gate[:, None] * y`, then the modulated norm of h) vs
rocm_sd::add_ada_layer_norm. scale / shift / gate are chunks of one (B, 6C) embedding, as the blocks make them.

    python bench/bench_ada_layer_norm.py [--out-dir bench/results] [--dtype bfloat16]

Bytes counted: ada_layer_norm one read of x and one write of the output; add_ada_layer_norm two reads (x, y) and
two writes (h, n), the least either form must move (the (B, C) parameters are negligible).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.harness import copy_ceiling_gbps, device_ms, kernel_bench_args, rotating_inputs, write_results  # noqa: E402
from rocm_sd.ops.ada_layer_norm import (ada_layer_norm_kernel, ada_layer_norm_ref,  # noqa: E402
                                        add_ada_layer_norm_kernel, add_ada_layer_norm_ref,
                                        add_ada_layer_norm_supports, supports)
from tests.shapes import ADA_LAYER_NORM_DIT  # noqa: E402

EPS = 1e-6
BACKENDS = ("torch", "compile", "rocm_sd")  # torch: eager, as the other kernel benchmarks name it


def _modulation(shape, dtype):
    b, _, c = shape
    return torch.randn(b, 6 * c, device="cuda", dtype=dtype).chunk(6, dim=1)[:3]  # shift, scale, gate


def setup(shape, dtype):
    inputs = rotating_inputs(lambda: torch.randn(shape, device="cuda", dtype=dtype), torch.Size(shape).numel() * 2)
    shift, scale, _ = _modulation(shape, dtype)
    compiled = torch.compile(ada_layer_norm_ref, dynamic=False)
    return inputs, {"torch": lambda x: ada_layer_norm_ref(x, scale, shift, EPS),
                    "compile": lambda x: compiled(x, scale, shift, EPS),
                    "rocm_sd": lambda x: ada_layer_norm_kernel(x, scale, shift, EPS)}, supports(inputs[0], scale,
                                                                                                 shift, EPS)


def setup_add(shape, dtype):
    def make():
        return torch.randn(shape, device="cuda", dtype=dtype), torch.randn(shape, device="cuda", dtype=dtype)

    inputs = rotating_inputs(make, torch.Size(shape).numel() * 4)
    shift, scale, gate = _modulation(shape, dtype)
    compiled = torch.compile(add_ada_layer_norm_ref, dynamic=False)
    return inputs, {"torch": lambda xy: add_ada_layer_norm_ref(*xy, gate, scale, shift, EPS),
                    "compile": lambda xy: compiled(*xy, gate, scale, shift, EPS),
                    "rocm_sd": lambda xy: add_ada_layer_norm_kernel(*xy, gate, scale, shift, EPS)}, \
        add_ada_layer_norm_supports(*inputs[0], gate, scale, shift, EPS)


def compare(op: str, args, setup_fn, tensors_moved: int) -> None:
    """eager, compile and rocm_sd at each shape: device ms (graph replays over rotating inputs), GB/s, and
    rocm_sd's speed-up over each. Appends the run to bench/results/data/<op>-<device>.jsonl."""
    dtype = getattr(torch, args.dtype)
    ceiling = copy_ceiling_gbps()
    rows = [{"op": "copy", "shape": "1Gi fp16", "gbps": round(ceiling, 1)}]
    lines = [f"{op}, {args.dtype}. Copy ceiling (read + write, 1 GiB): {ceiling:.0f} GB/s. Device time from graph "
             "replays over rotating inputs; compile: torch.compile(dynamic=False) of the reference.", "",
             "| shape | eager ms | compile ms | rocm_sd ms | vs eager | vs compile | rocm_sd GB/s | % of copy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in ADA_LAYER_NORM_DIT:
        inputs, fns, reasons = setup_fn(shape, dtype)
        if reasons:
            raise SystemExit(f"rocm_sd kernel cannot run {shape}: {reasons}")
        nbytes = torch.Size(shape).numel() * dtype.itemsize * tensors_moved
        times = {backend: device_ms(fns[backend], inputs) for backend in BACKENDS}
        for backend, ms in times.items():
            gbps = nbytes / ms / 1e6
            rows.append({"op": op, "shape": str(shape), "dtype": args.dtype, "backend": backend, "ms": round(ms, 4),
                         "gbps": round(gbps, 1), "pct_copy": round(100 * gbps / ceiling, 1)})
        k = rows[-1]
        lines.append(f"| {shape} | {times['torch']:.4f} | {times['compile']:.4f} | {times['rocm_sd']:.4f} | "
                     f"{times['torch'] / times['rocm_sd']:.2f}x | {times['compile'] / times['rocm_sd']:.2f}x | "
                     f"{k['gbps']:.0f} | {k['pct_copy']:.1f} |")
        print(lines[-1], flush=True)
    print(write_results(op, rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    args = kernel_bench_args(__doc__, lambda parser: parser.set_defaults(dtype="bfloat16"))
    compare("ada_layer_norm", args, setup, 2)
    compare("add_ada_layer_norm", args, setup_add, 4)
