"""RocmQuantizedConv2d: a convolution whose input a GroupNorm(+SiLU) writes, as an FP8 GEMM over the input's patches.

torch has no FP8 convolution, but its FP8 GEMM (torch._scaled_mm: cuBLASLt / hipBLASLt) runs at the FP8 rate. So
the convolution is the GEMM of two per-tensor FP8 operands:

    rocm_sd::im2col_quantize(x)       one row per output pixel: the window's taps, each the C channels of one input
                                      pixel (channels_last makes a tap one contiguous read), in fp8 with one scale
    weight (N, kh * kw * C)           the same tap order, quantized once with one scale
    torch._scaled_mm                  per-tensor scales, bias in the epilogue, output in the input's dtype; its
                                      (pixels, N) rows are the output in channels_last, a view, no copy

The input needs one scale before a kernel sees it, and the scale must hold for every value: a GroupNorm bounds its
output (patch/precision.group_norm_bound: the normalized group has mean 0 and sum of squares at most its size n, so
no element exceeds sqrt(n - 1)), and SiLU keeps that bound. n grows with the image, so the bound is taken per call
from the input's pixels (one float of host arithmetic; under graph capture it is part of the captured call).

Writing the patches costs kh * kw bytes per input element. At SD's 3x3 convolutions the FP8 GEMM is 2-3x cuDNN's
fp16 convolution on Hopper, so the total pays at 640 channels and more; where it does not (the tuning database's
`conv_8bit` problem says, as for the linear layers' `linear_8bit`), the layer goes back to its fp16 original at its
first call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..op_names import CONV_8BIT
from ..ops.im2col_quantize import FP8_FORMATS, im2col_quantize, out_size
from ..ops.spec import dtype_name, problem_key
from .quantized_linear import BOUND_MARGIN, _scope, fp16_measured_faster, linear_8bit, quantize_weight

OP = CONV_8BIT  # the tuning problem
SILU_NEGATIVE_MAX = 0.2785  # max |silu(y)| over y < 0 (0.27846 at y = -1.2785); silu(y) <= y for y >= 0


@dataclass(frozen=True)
class GroupNormBound:
    """What bounds the output of a GroupNorm (with SiLU) of `group_channels` channels per group: its largest |weight|
    (`gain`) and |bias| (`shift`), read from the norm when optimize() runs (patch/precision.group_norm_bound)."""
    group_channels: int
    gain: float
    shift: float

    def at(self, pixels: int) -> float:
        """No output value exceeds this at `pixels` per image: sqrt(n - 1) max|weight| + max|bias| with n the group's
        size, and SiLU's at most max(that, 0.2785), with the margin."""
        n = self.group_channels * pixels
        return BOUND_MARGIN * max(math.sqrt(max(n - 1, 0)) * self.gain + self.shift, SILU_NEGATIVE_MAX)


def conv_8bit_key(dtype: torch.dtype, format: str, rows: int, in_channels: int, out_channels: int,
                  window: tuple[int, int], stride: tuple[int, int]) -> str:
    """'conv_8bit|float16|e4m3fn|C=640,N=640,window=3x3,stride=1x1|M=8192': the layer's shape, then the GEMM's rows
    (output pixels of the batch) as the last part, which the database's nearest lookup compares (tune/db.py): another
    resolution or batch takes the same layer's nearest tuned rows."""
    layer = problem_key(OP, str(dtype).removeprefix("torch."), format, C=in_channels, N=out_channels,
                        window=f"{window[0]}x{window[1]}", stride=f"{stride[0]}x{stride[1]}")
    return f"{layer}|M={rows}"


class RocmQuantizedConv2d(nn.Module):
    """Holds the FP8 weight (`weight_q` (N, kh * kw * C), `weight_scale` (1, 1) buffers), the original bias (the `bias`
    parameter) and the bound of its input's producer; once its first call has found fp16 the faster (offer_fp16), the
    original convolution (`fp16_layer`) instead."""

    def __init__(self, conv: nn.Conv2d, format: str, input_bound: GroupNormBound):
        super().__init__()
        if format not in FP8_FORMATS:
            raise ValueError(f"RocmQuantizedConv2d: format {format!r} is not one of {', '.join(FP8_FORMATS)}")
        if not quantizable_conv(conv):
            raise ValueError(f"RocmQuantizedConv2d: {conv} is not a zero-padded convolution of one group without "
                             "dilation")
        self.format = format
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride, self.padding = conv.kernel_size, conv.stride, conv.padding
        self.input_bound = input_bound
        rows = conv.weight.detach().permute(0, 2, 3, 1).reshape(conv.out_channels, -1)  # taps major, channels minor
        q, scale = quantize_weight(rows, format, per_tensor=True)
        self.register_buffer("weight_q", q)
        self.register_buffer("weight_scale", scale)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach(), requires_grad=False)
        self.fp16_layer: nn.Module | None = None

    def extra_repr(self) -> str:
        kept = ", kept in the model's dtype (measured faster)" if self.fp16_layer is not None else ""
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, format={self.format}{kept}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convolve(x, with_bias=True)

    def convolve(self, x: torch.Tensor, with_bias: bool) -> torch.Tensor:
        """The convolution, with or without its bias (the fused resnet adds it elsewhere: modules/resnet.py)."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"RocmQuantizedConv2d: input of shape {tuple(x.shape)} is not (N, {self.in_channels}, "
                             "H, W)")
        if "_fp16_offer" in self.__dict__ and x.numel() and not _scope(x)[1]:  # never in a capture: warm-ups decide
            self._choose(x, *self.__dict__.pop("_fp16_offer"))
        if self.fp16_layer is not None:
            conv = self.fp16_layer
            return F.conv2d(x, conv.weight, conv.bias if with_bias else None, conv.stride, conv.padding)
        n, _, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        q, scale = im2col_quantize.call(x, self.format, self.input_bound.at(h * w), kh, kw, sh, sw, ph, pw)
        out = linear_8bit(q, scale, self.weight_q, self.weight_scale, self.bias if with_bias else None, self.format,
                          x.dtype)
        return out.view(n, out_size(h, kh, sh, ph), out_size(w, kw, sw, pw), self.out_channels).permute(0, 3, 1, 2)

    def offer_fp16(self, original: nn.Module, counts) -> None:
        """As RocmQuantizedLinear.offer_fp16: the first call goes back to `original` (waiting in CPU memory) if the
        tuning database measured the fp16 convolution faster for the call's shape."""
        self.__dict__["_fp16_offer"] = (original, counts)

    def problem_key(self, x: torch.Tensor) -> str:
        n, _, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        rows = n * out_size(h, kh, sh, ph) * out_size(w, kw, sw, pw)
        return conv_8bit_key(x.dtype, self.format, rows, self.in_channels, self.out_channels, self.kernel_size,
                             self.stride)

    def _choose(self, x: torch.Tensor, original: nn.Module, counts) -> None:
        if not fp16_measured_faster(x, self.problem_key(x)):
            return
        self.fp16_layer = original.to(x.device)
        self.weight_q = self.weight_scale = None  # the FP8 weight is freed
        counts[f"conv{self.kernel_size[0]}x{self.kernel_size[1]} -> {self.format} GEMM"] -= 1
        counts[f"conv{self.kernel_size[0]}x{self.kernel_size[1]} kept in {dtype_name(x)} (measured faster than "
               f"{self.format})"] += 1


def quantizable_conv(conv: nn.Module) -> bool:
    """A plain nn.Conv2d the GEMM computes: zero padding given as numbers, one group, no dilation."""
    return (type(conv) is nn.Conv2d and conv.padding_mode == "zeros" and not isinstance(conv.padding, str)
            and conv.groups == 1 and conv.dilation == (1, 1))
