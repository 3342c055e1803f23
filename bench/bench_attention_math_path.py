"""Attention where SDPA has no fused kernel: SDPA's math path vs the rocm_sd kernel an untuned call then runs.

    python bench/bench_attention_math_path.py [--out-dir bench/results] [--dtype float16]

On ROCm, SDPA takes its math path (every score materialised) on the GPUs where AOTriton's fused kernels are off
(gfx1100, gfx1101, gfx1151, gfx1200 unless TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1) and, in older releases, above
head dim 256; there an untuned rocm_sd::attention call runs rocm_sd's kernel (ops/attention.py). No AMD GPU is
available: an NVIDIA GPU stands in, with SDPA's flash, efficient and cuDNN backends switched off
(torch.backends.cuda.enable_*_sdp(False)) so that SDPA takes the same math path. The SD1.5 (512x512) and SDXL
(1024x1024) UNet attentions with CFG batch 2, and the VAE decoder's mid-block (one head of 512) at 512x512 and
1024x1024. Columns: the fused SDPA this NVIDIA GPU has (for scale only: those ROCm GPUs lack it), the math path,
for head dims above 256 the math path in query chunks (what rocm_sd ran there before), and rocm_sd::attention as an
untuned call (its self-check runs in the warm-up; no tuning database is read, the shipped defaults neither). Time:
device ms from graph replays over rotating inputs; peak: the memory one call allocates beyond its inputs (scores,
softmax, output), MB. OOM where the GPU ran out.
"""
from __future__ import annotations

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rocm_sd  # noqa: E402
from rocm_sd import config  # noqa: E402
from rocm_sd.tune import active  # noqa: E402
from bench.harness import device_ms, kernel_bench_args, rotating_inputs, write_results  # noqa: E402
from rocm_sd.ops.attention import SCORE_BUDGET_BYTES, attention_ref, sdpa_fused_backends  # noqa: E402
from tests.sdpa_switches import sdpa_switched  # noqa: E402

# (model, (batch, q_len, kv_len, heads, head_dim)): tests/shapes.py's ATTENTION_SD, the self- and cross-attentions.
SHAPES = [
    ("SD1.5 512", (2, 4096, 4096, 8, 40)), ("SD1.5 512", (2, 4096, 77, 8, 40)), ("SD1.5 512", (2, 1024, 1024, 8, 80)),
    ("SD1.5 512", (2, 256, 256, 8, 160)),
    ("SDXL 1024", (2, 4096, 4096, 10, 64)), ("SDXL 1024", (2, 4096, 77, 10, 64)),
    ("SDXL 1024", (2, 1024, 1024, 20, 64)), ("SDXL 1024", (2, 1024, 154, 20, 64)),
    ("VAE mid-block 512", (1, 4096, 4096, 1, 512)), ("VAE mid-block 1024", (1, 16384, 16384, 1, 512)),
]


def make_inputs(shape, dtype):
    """q, k, v as [B, L, H, D] views of one projection each (KV packed), rotating over more than L2."""
    batch, q_len, kv_len, heads, dim = shape

    def make():
        q = torch.randn(batch, q_len, heads, dim, device="cuda", dtype=dtype)
        kv = torch.randn(batch, kv_len, 2, heads, dim, device="cuda", dtype=dtype)
        return q, kv[:, :, 0], kv[:, :, 1], dim ** -0.5

    return rotating_inputs(make, (batch * q_len * heads * dim + 2 * batch * kv_len * heads * dim) * dtype.itemsize)


def peak_mb(fn, args) -> float:
    """MB one call allocates beyond what was allocated before it (its inputs): scores, softmax, output."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn(*args)
    torch.cuda.synchronize()
    del out
    return (torch.cuda.max_memory_allocated() - before) / 2 ** 20


def measure(fn, inputs) -> tuple[float | None, float | None]:
    """(device ms, peak MB) after a warm-up call (lazy initialisation, the op's plan and self-check), (None, None)
    where the GPU runs out of memory."""
    try:
        fn(*inputs[0])
        peak = peak_mb(fn, inputs[0])
        return device_ms(lambda args: fn(*args), inputs), peak
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None, None


def untuned_op(q, k, v, scale):
    return torch.ops.rocm_sd.attention(q, k, v, scale)


def chunked(q, k, v, scale):
    return attention_ref(q, k, v, scale, budget_bytes=SCORE_BUDGET_BYTES)


def rounded(value: float | None, digits: int) -> float | None:
    return round(value, digits) if value is not None else None


def ratio(math: float | None, kernel: float | None) -> str:
    return f"{math / kernel:.1f}x" if math and kernel else "OOM"


def cell(ms: float | None, mb: float | None = None) -> str:
    if ms is None:
        return "OOM"
    return f"{ms:.3f}" if mb is None else f"{ms:.3f} / {mb:.0f}"


def main() -> None:
    args = kernel_bench_args(__doc__)
    # Untuned calls, as a GPU without a tuning database makes them: no shipped defaults (measured with SDPA's fused
    # kernels on), no user database
    with tempfile.TemporaryDirectory() as no_database, config.override(tune_defaults=False, tune_db=no_database):
        active.reload()
        try:
            measure_all(args)
        finally:
            active.reload()


def measure_all(args) -> None:
    dtype = getattr(torch, args.dtype)
    rows = []
    lines = ["NVIDIA stands in for ROCm: SDPA's fused backends switched off. ms: device time (graph replays); MB: "
             "memory a call allocates beyond its inputs.", "",
             "| model | B, Lq, Lk, H, D | fused SDPA ms (NVIDIA only) | math path ms / MB | chunked math ms / MB | "
             "rocm_sd untuned ms / MB | math / rocm_sd time | math / rocm_sd memory |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for model, shape in SHAPES:
        inputs = make_inputs(shape, dtype)
        q, k, v, _ = inputs[0]
        fused_ms, _ = measure(attention_ref, inputs)
        with sdpa_switched(False):
            if sdpa_fused_backends(q, k, v) != ():
                raise SystemExit(f"{shape}: SDPA still has a fused kernel with its backends off")
            math_ms, math_mb = measure(attention_ref, inputs)
            chunked_ms, chunked_mb = measure(chunked, inputs) if shape[-1] > 256 else (None, None)
            rocm_sd.reset_stats()
            op_ms, op_mb = measure(untuned_op, inputs)
        ran = rocm_sd.stats().get("attention", {})
        if set(ran) != {"rocm_sd"}:
            raise SystemExit(f"{shape}: the untuned call did not run rocm_sd's kernel ({ran}); see the warnings above "
                             "and `python -m rocm_sd info`")
        rows.append({"model": model, "shape": list(shape), "dtype": args.dtype, "fused_sdpa_ms": rounded(fused_ms, 4),
                     "math_ms": rounded(math_ms, 4), "math_peak_mb": rounded(math_mb, 1),
                     "chunked_math_ms": rounded(chunked_ms, 4), "chunked_math_peak_mb": rounded(chunked_mb, 1),
                     "rocm_sd_ms": rounded(op_ms, 4), "rocm_sd_peak_mb": rounded(op_mb, 1)})
        lines.append(f"| {model} | {', '.join(map(str, shape))} | {cell(fused_ms)} | {cell(math_ms, math_mb)} | "
                     f"{cell(chunked_ms, chunked_mb) if shape[-1] > 256 else '-'} | {cell(op_ms, op_mb)} | "
                     f"{ratio(math_ms, op_ms)} | {ratio(math_mb, op_mb)} |")
        print(lines[-1], flush=True)
    print(write_results("attention_math_path", rows, "\n".join(lines), args.out_dir))


if __name__ == "__main__":
    main()
