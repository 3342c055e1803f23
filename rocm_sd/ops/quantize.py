"""rocm_sd::quantize_rows: per-row symmetric 8-bit quantization, the activation side of optimize(precision=...)'s
GEMMs (hip/quantize/quantize_rows.hip).

    scale[m] = max(amax_m, MIN_AMAX) / FMAX        amax_m = max |x[m, :]|
    q[m, :]  = round(clamp(x[m, :] * (FMAX / max(amax_m, MIN_AMAX)), -FMAX, FMAX))   so x ~= q * scale[m]

in one of three formats (FORMATS): fp8 e4m3 as OCP defines it (gfx950, gfx12, NVIDIA sm_89+), its "fnuz" variant
(gfx942: MI300 / MI325) and int8. A NaN in a row makes its scale NaN (and its fp8 codes NaN), so the GEMM's output
row is NaN, never silently finite.
"""
from __future__ import annotations

import math

import torch

from .. import _ext, dispatch
from ._checks import check_floating, check_min_dims, fail
from ._common import DTYPE_CODES, dtype_reasons, stream_handle
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, problem_key, tensor_key

OP = "quantize_rows"

# Format name -> (code of rsd::QuantFormat in hip/include/rocm_sd/quantize/api.h, torch dtype, largest value).
FORMATS = {
    "e4m3fn": (0, torch.float8_e4m3fn, 448.0),
    "e4m3fnuz": (1, torch.float8_e4m3fnuz, 240.0),
    "int8": (2, torch.int8, 127.0),
}
MIN_AMAX = 1e-12


def quantize_rows_ref(x: torch.Tensor, format: str, bound: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, in fp32 as the kernel computes it (bit-exact against it). With `bound` > 0 (the kernels that
    quantize their own output: check_bound) every row is scaled as if its max |x| were `bound`: one scale for the
    tensor, values beyond it saturate."""
    _, dtype, fmax = FORMATS[format]
    rows = x.float()
    if bound > 0:
        amax = rows.new_full(rows.shape[:-1] + (1,), bound)
    else:
        amax = (rows.abs().amax(-1, keepdim=True) if rows.shape[-1]  # NaN propagates
                else rows.new_zeros(rows.shape[:-1] + (1,)))      # rows of length 0: nothing to scale
    clamped = torch.where(amax < MIN_AMAX, torch.full_like(amax, MIN_AMAX), amax)
    # Divisions of two full tensors: torch divides by a scalar (and a scalar by a tensor) through a reciprocal,
    # one rounding more than the kernel's (and IEEE's) division.
    fmax_t = torch.full_like(clamped, fmax)
    scaled = (rows * (fmax_t / clamped)).clamp(-fmax, fmax)
    q = scaled.nan_to_num(0.0).round().to(dtype) if dtype == torch.int8 else scaled.to(dtype)
    return q, (clamped / fmax_t).squeeze(-1).clone(memory_format=torch.contiguous_format)


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * scale per row, in fp32: what the GEMMs see."""
    return q.float() * scale.unsqueeze(-1)


def check_format(op: str, format: str) -> None:
    if format not in FORMATS:
        fail(op, f"format {format!r} is not one of {', '.join(FORMATS)}")


def check_bound(op: str, format: str, bound: float) -> None:
    """A quantized output's bound: 0 (a scale per row), or finite and positive with an fp8 format (an int8 code cannot
    carry a NaN, whose row then needs its own scale)."""
    if bound == 0:
        return
    if not math.isfinite(bound) or bound < 0:
        fail(op, f"bound {bound} is not 0 (a scale per row) or a finite positive value")
    if format == "int8":
        fail(op, "a bound (one scale per tensor) needs an fp8 format, not int8: an int8 code cannot carry a NaN")


def check_args(x: torch.Tensor, format: str) -> None:
    check_floating(OP, input=x)
    check_min_dims(OP, x, 1, "(..., K)")
    check_format(OP, format)


def row_batches(x: torch.Tensor) -> tuple[int, int] | None:
    """How the kernel reads x's rows: (0, 0) contiguous; (L, batch stride) for a (B, L, K) view whose batches each
    hold L contiguous rows (x[:, :L] of a joint attention's (B, L + L_txt, K) output); None where it cannot."""
    if x.is_contiguous():
        return 0, 0
    if (x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]
            and x.stride(0) >= x.shape[1] * x.shape[2]):
        return x.shape[1], x.stride(0)
    return None


def input_reasons(x: torch.Tensor) -> list[str]:
    reasons = dtype_reasons(x.dtype)
    if x.dim() == 0 or x.numel() == 0:
        reasons.append("empty tensor")
    if row_batches(x) is None:
        reasons.append(f"strides {tuple(x.stride())} are neither contiguous nor batches of contiguous rows")
    return reasons


def quantized_like(x: torch.Tensor, format: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (q, scale) for x (..., K) quantized per row: what every op with a quantized output allocates."""
    return (torch.empty(x.shape, dtype=FORMATS[format][1], device=x.device),
            torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device))


def _kernel_args(x, q, scale, format):
    k = x.shape[-1]
    return (x.data_ptr(), q.data_ptr(), scale.data_ptr(), DTYPE_CODES[x.dtype], FORMATS[format][0], x.numel() // k, k)


def _batches(x) -> dict:
    rows_per_batch, batch_stride = row_batches(x) or (0, 0)
    return {"rows_per_batch": rows_per_batch, "batch_stride": batch_stride}


def supports(x: torch.Tensor, format: str) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x),
                          lambda: _ext._C.quantize_rows_check(*_kernel_args(x, x, x, format), x.device.index,
                                                              **_batches(x)))


def quantize_rows_kernel(x: torch.Tensor, format: str, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The HIP kernel itself, no dispatch; `out`: (q, scale) to write into (contiguous, whatever x's layout)."""
    q, scale = quantized_like(x, format) if out is None else out
    _ext._C.quantize_rows_forward(*_kernel_args(x, q, scale, format), stream_handle(x.device), x.device.index,
                                  **_batches(x))
    return q, scale


def _fake(x, format):
    check_args(x, format)
    return quantized_like(x, format)


def _key(x, format) -> str:
    x = as_meta(x)
    return problem_key(OP, dtype_name(x), format, rows=x.numel() // max(x.shape[-1], 1), K=x.shape[-1])


def _samples(device, dtype) -> list[tuple]:
    """A 320-wide row (the kernel's vectors), a 33-wide one (its scalar path), an all-zero row among them."""
    wide = torch.randn(2, 8, 320, device=device, dtype=dtype)
    wide[0, 3] = 0
    return [(wide, "e4m3fn"), (torch.randn(5, 33, device=device, dtype=dtype) * 1e3, "e4m3fnuz"),
            (wide, "int8")]


SPEC = OpSpec(OP, reference=quantize_rows_ref, check_args=check_args, fake=_fake, supports=supports,
              launch=lambda plan, x, format: quantize_rows_kernel(x, format), torch_path=quantize_rows_ref,
              plan_key=lambda x, format: (tensor_key(x), format), key=_key,
              candidates=lambda x, format: {dispatch.TORCH: quantize_rows_ref, "rocm_sd": quantize_rows_kernel},
              samples=_samples, kernel=quantize_rows_kernel)


@SPEC.define
def quantize_rows(x: torch.Tensor, format: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): x (..., K) quantized per row into `format` ('e4m3fn', 'e4m3fnuz' or 'int8'), x ~= q * scale."""


# ---- which format a GPU takes --------------------------------------------------------------------------------

FP8_ARCHS = "gfx942 (e4m3fnuz), gfx950 and gfx12 (e4m3fn), NVIDIA sm_89 and newer (e4m3fn)"


def fp8_format(arch: str) -> tuple[str | None, str | None]:
    """(format, None) for an arch with FP8 matrix instructions, else (None, why): gfx942 (MI300 / MI325) multiplies
    e4m3fnuz, gfx950 (MI350), gfx12 (RDNA4) and NVIDIA sm_89+ the OCP e4m3fn; gfx90a and RDNA3 have none."""
    if arch == "gfx942":
        return "e4m3fnuz", None
    if arch == "gfx950" or arch.startswith("gfx12"):
        return "e4m3fn", None
    if arch.startswith("sm_") and arch[3:].isdigit() and int(arch[3:]) >= 89:
        return "e4m3fn", None
    hint = " (it has int8: precision='int8')" if arch.startswith(("gfx11", "gfx90a", "gfx10", "sm_")) else ""
    return None, f"{arch} has no FP8 matrix instructions{hint}; FP8 GPUs: {FP8_ARCHS}"
