"""rocm_sd::im2col_quantize: a convolution's input patches quantized with one scale, the A operand of a convolution
run as an FP8 GEMM (modules/quantized_conv.py; hip/im2col_quantize/).

    q[(n, ho, wo), (i * kw + j) * C + c] = quantize(x[n, c, ho * sh - ph + i, wo * sw - pw + j])   0 in the padding
    scale = bound / fmax

One row per output pixel, the window's taps in row-major order, each tap the C channels of one input pixel: the
layout of a channels_last input, so a tap is one contiguous read. The bound is a value no element of x can exceed
(patch/precision.py takes it from the GroupNorm in front of the convolution), so the tensor has one scale, bit for bit
quantize_rows_ref(patches, format, bound): fp8 formats only. The kernel takes channels_last fp16 / bf16 / fp32 input;
anything else takes the PyTorch path, which computes the same definition.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import _ext, dispatch
from ._checks import check_floating, fail
from ._common import DTYPE_CODES, NHWC, dtype_reasons, layout_of, stream_handle
from .quantize import FORMATS, check_format, quantize_rows_ref
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, problem_key, tensor_key

OP = "im2col_quantize"
FP8_FORMATS = tuple(f for f in FORMATS if f != "int8")
MAX_TAPS = 64  # the kernel's check: SD's windows are 3x3 and 1x1


def out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    """The convolution's output size along one dimension (no dilation)."""
    return (size + 2 * pad - kernel) // stride + 1


def check_args(x: torch.Tensor, format: str, bound: float, kernel_h: int, kernel_w: int, stride_h: int = 1,
               stride_w: int = 1, pad_h: int = 0, pad_w: int = 0) -> None:
    check_floating(OP, input=x)
    if x.dim() != 4:
        fail(OP, f"input of shape {tuple(x.shape)} is not (N, C, H, W)")
    check_format(OP, format)
    if format not in FP8_FORMATS:
        fail(OP, f"format {format!r} is not an fp8 format ({', '.join(FP8_FORMATS)}): one scale per tensor needs one")
    if not (math.isfinite(bound) and bound > 0):
        fail(OP, f"bound {bound} is not a finite positive value (no element of the input may exceed it)")
    if not (kernel_h > 0 and kernel_w > 0 and kernel_h * kernel_w <= MAX_TAPS):
        fail(OP, f"a {kernel_h}x{kernel_w} window is not 1 to {MAX_TAPS} taps")
    if stride_h <= 0 or stride_w <= 0 or not (0 <= pad_h < kernel_h and 0 <= pad_w < kernel_w):
        fail(OP, f"stride ({stride_h}, {stride_w}) must be positive and padding ({pad_h}, {pad_w}) smaller than the "
                 f"{kernel_h}x{kernel_w} window")
    if out_size(x.shape[2], kernel_h, stride_h, pad_h) <= 0 or out_size(x.shape[3], kernel_w, stride_w, pad_w) <= 0:
        fail(OP, f"a {kernel_h}x{kernel_w} window with padding ({pad_h}, {pad_w}) does not fit the input's "
                 f"{x.shape[2]}x{x.shape[3]} pixels")


def _patches_shape(x, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w) -> tuple[int, int]:
    n, c, h, w = x.shape
    return (n * out_size(h, kernel_h, stride_h, pad_h) * out_size(w, kernel_w, stride_w, pad_w),
            kernel_h * kernel_w * c)


def patches(x: torch.Tensor, kernel_h: int, kernel_w: int, stride_h: int = 1, stride_w: int = 1, pad_h: int = 0,
            pad_w: int = 0) -> torch.Tensor:
    """x's patches in fp32 as the kernel lays them out: (N * Ho * Wo, kh * kw * C), taps major, channels minor."""
    n, c = x.shape[:2]
    cols = F.unfold(x.float(), (kernel_h, kernel_w), padding=(pad_h, pad_w), stride=(stride_h, stride_w))
    return cols.view(n, c, kernel_h * kernel_w, cols.shape[-1]).permute(0, 3, 2, 1).reshape(-1, kernel_h * kernel_w * c)


def im2col_quantize_ref(x: torch.Tensor, format: str, bound: float, kernel_h: int, kernel_w: int, stride_h: int = 1,
                        stride_w: int = 1, pad_h: int = 0, pad_w: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, bit-exact against the kernel: (q, scale), scale a 0-dim float32 tensor."""
    q, scale = quantize_rows_ref(patches(x, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w), format, bound)
    if scale.numel() == 0:  # no output pixels (an empty batch): the scale the kernel would write
        scale = torch.tensor(bound / FORMATS[format][2], dtype=torch.float32, device=x.device)
    return q.contiguous(), scale.reshape(-1)[:1].reshape(()).clone()


def input_reasons(x: torch.Tensor) -> list[str]:
    reasons = dtype_reasons(x.dtype)
    if x.numel() == 0:
        reasons.append("empty tensor")
    elif layout_of(x) != NHWC:
        reasons.append(f"strides {tuple(x.stride())} are not channels_last (the kernel reads a tap's channels as one run)")
    return reasons


def _kernel_args(x, q_ptr: int, scale_ptr: int, format, bound, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w):
    n, c, h, w = x.shape
    return (x.data_ptr(), q_ptr, scale_ptr, DTYPE_CODES.get(x.dtype, 0), FORMATS[format][0], n, h, w, c, kernel_h,
            kernel_w, stride_h, stride_w, pad_h, pad_w, float(bound))


def supports(x, format, bound, kernel_h, kernel_w, stride_h=1, stride_w=1, pad_h=0, pad_w=0) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    args = (format, bound, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w)
    return kernel_reasons(x.device, input_reasons(x),
                          lambda: _ext._C.im2col_quantize_check(*_kernel_args(x, 256, 256, *args), x.device.index))


def _outputs(x, format, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w) -> tuple[torch.Tensor, torch.Tensor]:
    shape = _patches_shape(x, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w)
    return (torch.empty(shape, dtype=FORMATS[format][1], device=x.device),
            torch.empty((), dtype=torch.float32, device=x.device))


def im2col_quantize_kernel(x, format, bound, kernel_h, kernel_w, stride_h=1, stride_w=1, pad_h=0, pad_w=0):
    """The HIP kernel itself, no dispatch."""
    q, scale = _outputs(x, format, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w)
    _ext._C.im2col_quantize_forward(*_kernel_args(x, q.data_ptr(), scale.data_ptr(), format, bound, kernel_h,
                                                  kernel_w, stride_h, stride_w, pad_h, pad_w),
                                    stream_handle(x.device), x.device.index)
    return q, scale


def _fake(x, format, bound, kernel_h, kernel_w, stride_h=1, stride_w=1, pad_h=0, pad_w=0):
    check_args(x, format, bound, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w)
    return _outputs(x, format, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w)


def _key(x, format, bound, kernel_h, kernel_w, stride_h=1, stride_w=1, pad_h=0, pad_w=0) -> str:
    x = as_meta(x)
    n, c, h, w = x.shape
    return problem_key(OP, dtype_name(x), format, N=n, C=c, H=h, W=w, window=f"{kernel_h}x{kernel_w}",
                       stride=f"{stride_h}x{stride_w}", pad=f"{pad_h}x{pad_w}")


def _samples(device, dtype) -> list[tuple]:
    """SD's 3x3 window (320 channels: the kernel's vectors) in both fp8 formats, a strided 3x3 with a bound some
    values exceed (they saturate), an odd channel count (the scalar path) and a 1x1 window."""
    wide = torch.randn(2, 320, 5, 6, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    odd = torch.randn(1, 3, 7, 4, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    return [(wide, "e4m3fn", 6.0, 3, 3, 1, 1, 1, 1), (wide, "e4m3fnuz", 6.0, 3, 3, 1, 1, 1, 1),
            (wide, "e4m3fn", 1.5, 3, 3, 2, 2, 1, 1), (odd, "e4m3fn", 6.0, 3, 3, 1, 1, 1, 1),
            (odd, "e4m3fnuz", 6.0, 1, 1, 1, 1, 0, 0)]


SPEC = OpSpec(OP, reference=im2col_quantize_ref, check_args=check_args, fake=_fake, supports=supports,
              launch=lambda plan, *args: im2col_quantize_kernel(*args), torch_path=im2col_quantize_ref,
              plan_key=lambda x, *rest: (tensor_key(x), *rest), key=_key,
              candidates=lambda *args: {dispatch.TORCH: im2col_quantize_ref, "rocm_sd": im2col_quantize_kernel},
              samples=_samples, kernel=im2col_quantize_kernel)


@SPEC.define
def im2col_quantize(x: torch.Tensor, format: str, bound: float, kernel_h: int, kernel_w: int, stride_h: int = 1,
                    stride_w: int = 1, pad_h: int = 0, pad_w: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): the patches of x (N, C, H, W) for a kernel_h x kernel_w window, one row per output pixel, quantized
    into the fp8 `format` with one scale, bound / fmax (no element of x may exceed `bound`)."""
