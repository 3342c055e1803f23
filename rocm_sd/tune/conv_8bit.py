"""The `conv_8bit` problems: per FP8 convolution shape, whether its FP8 GEMM pays against the fp16 convolution.

optimize(precision="fp8") runs the resnets' convolutions as FP8 GEMMs over their patches (modules/quantized_conv.py);
with precision_layers="measured" each goes back to fp16 at its first call where the database says `torch` for its
problem (quantized_conv.conv_8bit_key: channels, window, stride, and the output pixels of the batch). The tuner's
`--precision fp8` pass records those problems from the model's real calls and times, on channels_last inputs cycling
through more memory than the L2 cache:

    torch      the fp16 (bf16, fp32) convolution with bias, as the model runs it (cuDNN / MIOpen)
    <format>   rocm_sd::im2col_quantize and the per-tensor FP8 GEMM with bias: the layer's whole forward
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dispatch import TORCH
from ..modules.quantized_conv import RocmQuantizedConv2d, conv_8bit_key, out_size
from ..modules.quantized_linear import linear_8bit, quantize_weight
from ..op_names import CONV_8BIT
from ..ops import REGISTRY
from ..timing import graph_device_ms
from .measure import MAX_COPIES

OP = CONV_8BIT
BOUND = 64.0  # any bound: the kernels' time does not depend on it
# The FP8 convolution must be this much faster to be chosen: it changes the image more than the FP8 linear layers do
# (bench/results/notes/2026-11-25-fp8-convolutions-h100.md), so a tie within timing noise keeps fp16.
REQUIRED_SPEEDUP = 1.05


@dataclass(frozen=True)
class Conv8bitCall:
    dtype: torch.dtype
    format: str
    images: int
    height: int
    width: int
    in_channels: int
    out_channels: int
    window: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]

    @property
    def key(self) -> str:
        (kh, kw), (sh, sw), (ph, pw) = self.window, self.stride, self.padding
        rows = self.images * out_size(self.height, kh, sh, ph) * out_size(self.width, kw, sw, pw)
        return conv_8bit_key(self.dtype, self.format, rows, self.in_channels, self.out_channels, self.window,
                             self.stride)

    @property
    def candidates(self) -> tuple[str, str]:
        return TORCH, self.format


@contextmanager
def recording(model: torch.nn.Module):
    """Records every FP8 convolution call of `model` while inside (a dict Conv8bitCall -> calls, filled in place)."""
    calls: dict[Conv8bitCall, int] = {}

    def record(layer: RocmQuantizedConv2d, args: tuple) -> None:
        x = args[0]
        call = Conv8bitCall(x.dtype, layer.format, x.shape[0], x.shape[2], x.shape[3], layer.in_channels,
                            layer.out_channels, layer.kernel_size, layer.stride, layer.padding)
        calls[call] = calls.get(call, 0) + 1

    # The fused resnet forward calls convolve(), not forward(): hooks would miss it, so the method is wrapped.
    layers = [m for m in model.modules() if isinstance(m, RocmQuantizedConv2d)]
    for layer in layers:
        layer.convolve = _recorded(layer, record)
    try:
        yield calls
    finally:
        for layer in layers:
            del layer.convolve


def _recorded(layer: RocmQuantizedConv2d, record):
    convolve = type(layer).convolve

    def recorded(x: torch.Tensor, with_bias: bool) -> torch.Tensor:
        record(layer, (x,))
        return convolve(layer, x, with_bias)
    return recorded


def measure(call: Conv8bitCall, device: torch.device, l2_bytes: int, calls_per_run: int) -> dict:
    """The database result of one problem: the faster candidate and both times."""
    gen = torch.Generator(device).manual_seed(0)
    (kh, kw), (sh, sw), (ph, pw) = call.window, call.stride, call.padding
    c, n = call.in_channels, call.out_channels
    weight = (torch.randn(n, c, kh, kw, device=device, generator=gen) / (c * kh * kw) ** 0.5).to(call.dtype)
    weight = weight.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(n, device=device, generator=gen).to(call.dtype)
    weight_q, weight_scale = quantize_weight(weight.permute(0, 2, 3, 1).reshape(n, -1), call.format, per_tensor=True)
    image_bytes = call.images * c * call.height * call.width * 2
    copies = max(1, min(MAX_COPIES, -(-2 * l2_bytes // max(image_bytes, 1))))
    xs = [(torch.randn(call.images, c, call.height, call.width, device=device, generator=gen).to(call.dtype)
           .contiguous(memory_format=torch.channels_last),) for _ in range(copies)]
    im2col = REGISTRY["im2col_quantize"]

    def fp8(x):
        q, scale = im2col.call(x, call.format, BOUND, kh, kw, sh, sw, ph, pw)
        return linear_8bit(q, scale, weight_q, weight_scale, bias, call.format, call.dtype)

    times = {TORCH: graph_device_ms(lambda x: F.conv2d(x, weight, bias, (sh, sw), (ph, pw)), xs),
             call.format: graph_device_ms(fp8, xs)}
    return result(call, times, calls_per_run)


def result(call: Conv8bitCall, times: dict[str, float], calls_per_run: int) -> dict:
    """The database result of one problem from both candidates' device ms: the FP8 convolution only where it is
    REQUIRED_SPEEDUP times faster than fp16."""
    choice, other = ((call.format, TORCH) if times[call.format] * REQUIRED_SPEEDUP < times[TORCH]
                     else (TORCH, call.format))
    return {"choice": choice, "ms": round(times[choice], 5), "torch_ms": round(times[TORCH], 5),
            "speedup_vs_torch": round(times[TORCH] / times[choice], 3),
            "runners_up": [[other, round(times[other], 5)]], "rejected": {}, "calls_per_run": calls_per_run}
