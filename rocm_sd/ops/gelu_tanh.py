"""rocm_sd::gelu_tanh: the diffusion transformers' feed-forward activation after a GEMM without its bias + GELU
epilogue (hip/gelu_tanh/gelu_tanh.hip), and rocm_sd::gelu_tanh_quantized, the same writing 8-bit rows for the output
projection that follows (optimize(precision="fp8" / "int8")):

    y = gelu(x + bias, approximate="tanh")       x: (..., D) contiguous, the GEMM's output; bias: (D,) or None
    (q, row_scale) = quantize_rows_ref(y, format)    y itself not written

Where PyTorch runs the vendor GEMM's epilogue (torch._addmm_activation: cuBLASLt, hipBLASLt on CDNA; modules/mmdit.py's
addmm_gelu_tanh) it runs the bias and GELU itself, and this op after a bias-free GEMM elsewhere (RDNA);
bench/bench_gelu_tanh.py measures the two per shape. The
quantized rows take fp16 / bf16 rows of a multiple of 8 features that fit one block (modules/mmdit_8bit.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _ext, dispatch
from ._checks import check_floating, check_min_dims, check_same_device, fail
from ._common import DTYPE_CODES, dtype_reasons, stream_handle
from .quantize import FORMATS, check_format, quantize_rows_ref, quantized_like
from .quantized_outputs import _key as quantized_key
from .quantized_outputs import _quantized_args, kernel_widths
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, layout_name, problem_key, tensor_key

OP = "gelu_tanh"
QUANTIZED_OP = "gelu_tanh_quantized"


def gelu_tanh_ref(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """diffusers' GELU(approximate="tanh") of the projection's output, op for op; differentiable."""
    return F.gelu(x if bias is None else x + bias, approximate="tanh")


def check_args(x: torch.Tensor, bias: torch.Tensor | None, op: str = OP) -> torch.dtype:
    """Raises what the reference's PyTorch ops would raise (ops/_checks.py); returns the output dtype."""
    check_floating(op, input=x, **({} if bias is None else {"bias": bias}))
    check_min_dims(op, x, 1, "(..., D)")
    if bias is None:
        return x.dtype
    check_same_device(op, x, bias=bias)
    if bias.dim() != 1 or bias.shape[0] != x.shape[-1]:
        fail(op, f"bias of shape {tuple(bias.shape)} is not ({x.shape[-1]},), the input's last dimension")
    return torch.promote_types(x.dtype, bias.dtype)


def input_reasons(x: torch.Tensor, bias: torch.Tensor | None) -> list[str]:
    """Reasons in the arguments themselves that the kernel cannot take (no GPU needed to ask)."""
    reasons = dtype_reasons(x.dtype)
    if x.numel() == 0:
        reasons.append("empty tensor")
    if not x.is_contiguous():
        reasons.append(f"strides {tuple(x.stride())} are not contiguous")
    if bias is not None:
        if bias.dtype != x.dtype:
            reasons.append(f"bias dtype {bias.dtype} differs from the input's {x.dtype}")
        if not bias.is_contiguous():
            reasons.append("bias is not contiguous")
    return reasons


def _kernel_args(x: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor | None) -> tuple:
    d = x.shape[-1]
    return (x.data_ptr(), bias.data_ptr() if bias is not None else 0, y.data_ptr() if y is not None else 0,
            DTYPE_CODES[x.dtype], x.numel() // d, d)


def _key(x, bias) -> str:
    x = as_meta(x)
    return problem_key(OP, dtype_name(x), layout_name(x), rows=x.numel() // max(x.shape[-1], 1), D=x.shape[-1],
                       bias=int(bias is not None))


def _samples(device, dtype) -> list[tuple]:
    """Widths 64 (8-wide vectors) with and without a bias, 7 (the scalar path), and SD3.5 Large's 9728 (a row block
    of several waves for the quantized rows)."""
    return [(torch.randn(2, 16, 64, device=device, dtype=dtype), torch.randn(64, device=device, dtype=dtype)),
            (torch.randn(2, 16, 64, device=device, dtype=dtype), None),
            (torch.randn(3, 7, device=device, dtype=dtype), torch.randn(7, device=device, dtype=dtype)),
            (torch.randn(2, 9728, device=device, dtype=dtype), torch.randn(9728, device=device, dtype=dtype))]


# ---- gelu_tanh ---------------------------------------------------------------------------------------------------

def supports(x, bias) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x, bias),
                          lambda: _ext._C.gelu_tanh_check(*_kernel_args(x, bias, x), x.device.index))


def gelu_tanh_kernel(x, bias, out=None):
    """The HIP kernel itself, no dispatch (tests call it with a poisoned `out`)."""
    y = torch.empty_like(x) if out is None else out
    _ext._C.gelu_tanh_forward(*_kernel_args(x, bias, y), stream_handle(x.device), x.device.index)
    return y


def _torch_path(x, bias):
    return gelu_tanh_ref(x, bias).contiguous()


def _fake(x, bias):
    return torch.empty_like(x, dtype=check_args(x, bias), memory_format=torch.contiguous_format)


SPEC = OpSpec(OP, reference=gelu_tanh_ref, check_args=check_args, fake=_fake, supports=supports,
              launch=lambda plan, *args: gelu_tanh_kernel(*args), torch_path=_torch_path,
              plan_key=lambda x, bias: (tensor_key(x), tensor_key(bias)), key=_key,
              candidates=lambda *args: {dispatch.TORCH: gelu_tanh_ref, "rocm_sd": gelu_tanh_kernel},
              samples=_samples, kernel=gelu_tanh_kernel)


@SPEC.define
def gelu_tanh(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """gelu(x + bias, approximate="tanh")."""


# ---- gelu_tanh_quantized -----------------------------------------------------------------------------------------

def gelu_tanh_quantized_ref(x, bias, format):
    return quantize_rows_ref(gelu_tanh_ref(x, bias), format)


def _quantized_check(x, bias, format):
    check_args(x, bias, QUANTIZED_OP)
    check_format(QUANTIZED_OP, format)


def quantized_supports(x, bias, format) -> list[str]:
    sixteen_bit = [] if x.dtype in (torch.float16, torch.bfloat16) else [
        f"quantized output needs fp16 or bf16, not {x.dtype}"]
    return kernel_reasons(x.device, input_reasons(x, bias) + sixteen_bit,
                          lambda: _ext._C.gelu_tanh_check(*_kernel_args(x, bias, None), x.device.index,
                                                          **_quantized_args(None, None, format, 0.0)))


def gelu_tanh_quantized_kernel(x, bias, format, out=None):
    """The HIP kernel itself, no dispatch; `out`: (q, row_scale) to write into."""
    q, row_scale = quantized_like(x, format) if out is None else out
    _ext._C.gelu_tanh_forward(*_kernel_args(x, bias, None), stream_handle(x.device), x.device.index,
                              **_quantized_args(q, row_scale, format, 0.0))
    return q, row_scale


def _quantized_torch_path(x, bias, format):
    return quantize_rows_ref(_torch_path(x, bias), format)


def _quantized_fake(x, bias, format):
    dtype = check_args(x, bias, QUANTIZED_OP)
    check_format(QUANTIZED_OP, format)
    return quantized_like(torch.empty_like(x, dtype=dtype), format)


def _quantized_samples(device, dtype) -> list[tuple]:
    samples = kernel_widths(_samples(device, dtype))
    return [(*samples[0], format) for format in FORMATS] + [(*args, "e4m3fn") for args in samples[1:]]


QUANTIZED_SPEC = OpSpec(
    QUANTIZED_OP, reference=gelu_tanh_quantized_ref, check_args=_quantized_check, fake=_quantized_fake,
    supports=quantized_supports, launch=lambda plan, *args: gelu_tanh_quantized_kernel(*args),
    torch_path=_quantized_torch_path, plan_key=lambda x, bias, format: (tensor_key(x), tensor_key(bias), format),
    key=lambda x, bias, format: quantized_key(QUANTIZED_OP, x, format, 0.0, as_meta(x).shape[-1],
                                                       bias=int(bias is not None)),
    candidates=lambda *args: {dispatch.TORCH: _quantized_torch_path, "rocm_sd": gelu_tanh_quantized_kernel},
    samples=_quantized_samples, kernel=gelu_tanh_quantized_kernel)


@QUANTIZED_SPEC.define
def gelu_tanh_quantized(x: torch.Tensor, bias: torch.Tensor | None,
                        format: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, row_scale): gelu(x + bias, approximate="tanh") quantized per row into `format`, the activation itself not
    kept."""
