"""Host cost of one op call: PyTorch's op, rocm_sd's custom op, and rocm_sd's kernel launcher called directly.

    python bench/bench_dispatch_overhead.py [--out-dir bench/results] [--calls 5000]

Eager hosts (ComfyUI, A1111) run a UNet step without graph capture, so each op call's CPU time adds up:
an SD1.5 UNet evaluation makes ~140 calls of rocm_sd ops there. Tiny GPU tensors, so that launches are
queued faster than they run only if the host is fast: the number is microseconds of host time per call
(mean over `--calls` calls without synchronising, then one synchronisation).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rocm_sd  # noqa: E402,F401 - registers torch.ops.rocm_sd
from bench.harness import write_results  # noqa: E402
from rocm_sd.ops.group_norm import group_norm as group_norm_op  # noqa: E402  (the custom ops)
from rocm_sd.ops.layer_norm import layer_norm as layer_norm_op  # noqa: E402
from rocm_sd.ops.attention import scaled_dot_product_attention  # noqa: E402

layer_norm_module = sys.modules["rocm_sd.ops.layer_norm"]  # the op's file: its kernel launcher


def host_us(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    dev, dt = "cuda", torch.float16
    x = torch.randn(2, 64, 320, device=dev, dtype=dt)
    w, b = torch.randn(320, device=dev, dtype=dt), torch.randn(320, device=dev, dtype=dt)
    img = torch.randn(2, 320, 8, 8, device=dev, dtype=dt)
    q = torch.randn(2, 8, 64, 40, device=dev, dtype=dt)
    cases = {
        "layer_norm": [
            ("torch F.layer_norm", lambda: F.layer_norm(x, (320,), w, b, 1e-5)),
            ("torch.ops.rocm_sd.layer_norm", lambda: torch.ops.rocm_sd.layer_norm(x, w, b, 1e-5)),
            ("ops.layer_norm.call (what modules call)", lambda: layer_norm_op.call(x, w, b, 1e-5)),
            ("rocm_sd kernel launcher, no dispatch", lambda: layer_norm_module.layer_norm_kernel(x, w, b, 1e-5)),
        ],
        "group_norm+silu": [
            ("torch F.group_norm + F.silu", lambda: F.silu(F.group_norm(img, 32, w, b, 1e-5))),
            ("torch.ops.rocm_sd.group_norm", lambda: torch.ops.rocm_sd.group_norm(img, 32, w, b, 1e-5, True, None)),
            ("ops.group_norm.call (what modules call)", lambda: group_norm_op.call(img, 32, w, b, 1e-5, True, None)),
        ],
        "attention": [
            ("torch SDPA", lambda: F.scaled_dot_product_attention(q, q, q)),
            ("ops.attention.scaled_dot_product_attention (SDPA untuned)",
             lambda: scaled_dot_product_attention(q, q, q)),
        ],
    }
    rows, lines = [], ["| op | call | host us per call |", "|---|---|---:|"]
    with torch.inference_mode():
        for op, variants in cases.items():
            for name, fn in variants:
                us = host_us(fn, args.calls)
                rows.append({"op": op, "call": name, "host_us": round(us, 2)})
                lines.append(f"| {op} | {name} | {us:.2f} |")
                print(lines[-1], flush=True)
    print(rocm_sd.stats())
    print(write_results("dispatch-overhead", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
