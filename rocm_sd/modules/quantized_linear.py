"""RocmQuantizedLinear: a Linear (or a 1x1 convolution over channels_last activations) as an 8-bit GEMM.

The weight is quantized once, per output channel; the input per row (per token / pixel) on the fly by
rocm_sd::quantize_rows; the GEMM multiplies the 8-bit operands with fp32 accumulation and applies both scales and
the bias in its epilogue, writing the input's dtype:

    fp8  (e4m3fn / e4m3fnuz): torch._scaled_mm with row-wise scales (cuBLASLt / hipBLASLt)
    int8:                     torch._int_mm (int32 accumulators), then scales and bias

Off a GPU (and wherever those GEMMs cannot run) the same product is computed from the dequantized operands in fp32:
the numbers a GPU gives up to accumulation order, which is how the CPU tests check the math.

An input is quantized once, however many layers take it: its (q, scale) travel with the tensor (remember_rows),
so attention's to_q / to_k / to_v share one quantization of the norm's output, and the cross-attention keys and
values of every block one of the text embedding. The norms and the GEGLU in front of these layers write it
themselves (ops/quantized_outputs.py; patch/precision.py says which), so most layers quantize nothing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.quantize import FORMATS, dequantize_rows, quantize_rows, quantize_rows_ref


_REMEMBERED = "_rocm_sd_quantized_rows"
_call = [0]  # which model call a remembered quantization belongs to (new_model_call)


def new_model_call(*_) -> None:
    """Forgets every remembered quantization: a forward pre-hook of each quantized model. A quantization is only ever
    used inside the model call that made it, so inside one captured graph, where replays recompute it: one kept
    from an earlier call would be read at its old address by every replay, never refreshed."""
    _call[0] += 1


def _scope(x: torch.Tensor) -> tuple[int, bool]:
    """The model call, and whether x's stream is being captured into a graph: the warm-up calls before a capture are
    the same model call, and their quantizations must not be baked into the graph either. (Asked of GPU tensors
    only: a CPU-only torch cannot answer, and a CPU tensor is never in a graph.)"""
    return _call[0], x.is_cuda and torch.cuda.is_current_stream_capturing()


def _version(x: torch.Tensor) -> int | None:
    try:
        return x._version
    except RuntimeError:  # an inference tensor (ComfyUI samples in inference mode) has no version counter
        return None


def remember_rows(x: torch.Tensor, format: str, q: torch.Tensor, scale: torch.Tensor, trusted: bool = False) -> None:
    """Keeps x's per-row quantization on x for the next layers that take x in this model call, while x is unchanged:
    an in-place write bumps its version and the memory is ignored. Inference tensors have no version; their quantization is kept
    only when `trusted` (a norm or GEGLU whose every consumer is a quantized layer: patch/precision.py)."""
    if torch.compiler.is_compiling():
        return
    version = _version(x)
    if version is not None or trusted:
        setattr(x, _REMEMBERED, (format, version, _scope(x), q, scale))


def remembered_rows(x: torch.Tensor, format: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q, scale) of x in `format` as remember_rows kept it, if x has not changed since."""
    memory = getattr(x, _REMEMBERED, None)
    if memory is None or torch.compiler.is_compiling():
        return None
    kept_format, version, scope, q, scale = memory
    return (q, scale) if kept_format == format and scope == _scope(x) and version == _version(x) else None


class RocmQuantizedLinear(nn.Module):
    """Holds the 8-bit weight (`weight_q`, `weight_scale` buffers) and the original bias (the `bias` parameter)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, format: str, conv: bool = False):
        super().__init__()
        if format not in FORMATS:
            raise ValueError(f"RocmQuantizedLinear: format {format!r} is not one of {', '.join(FORMATS)}")
        self.format = format
        self.conv = conv  # a 1x1 convolution: (N, C, H, W) in and out
        self.out_features, self.in_features = weight.shape[0], weight.shape[1]
        q, scale = quantize_rows_ref(weight.detach().reshape(self.out_features, self.in_features), format)
        self.register_buffer("weight_q", q)
        self.register_buffer("weight_scale", scale.unsqueeze(0))  # (1, N): the GEMM's column scales
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @classmethod
    def from_module(cls, module: nn.Module, format: str) -> "RocmQuantizedLinear":
        return cls(module.weight, module.bias, format, conv=isinstance(module, nn.Conv2d))

    def extra_repr(self) -> str:
        kind = "conv1x1" if self.conv else "linear"
        return f"{kind}, in={self.in_features}, out={self.out_features}, format={self.format}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv:
            if x.dim() != 4:
                raise ValueError(f"RocmQuantizedLinear (1x1 convolution): input of shape {tuple(x.shape)} is not 4-D")
            rows = x.permute(0, 2, 3, 1)  # a view for channels_last input, which the convolution patches keep
            return self._rows(x, rows.reshape(-1, self.in_features)).view(*rows.shape[:-1], -1).permute(0, 3, 1, 2)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"RocmQuantizedLinear: input of shape {tuple(x.shape)} does not end in "
                             f"{self.in_features} features")
        return self._rows(x, x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)

    def _rows(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The layer on `rows` (x's rows, a view or a copy), with x's remembered quantization if it has one."""
        quantized = remembered_rows(x, self.format)
        if quantized is None:
            quantized = quantize_rows.call(rows.contiguous(), self.format)
            remember_rows(x, self.format, *quantized)
        q, scale = quantized
        return self.matmul(q.reshape(rows.shape), scale.reshape(rows.shape[0]), x.dtype)

    def matmul(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(q * scale) @ (weight_q * weight_scale).T + bias in `dtype`, from already quantized rows."""
        if q.is_cuda and q.shape[0] > 0:
            if self.format == "int8":
                if q.shape[0] > 16:  # torch._int_mm's smallest M
                    acc = torch._int_mm(q, self.weight_q.t())
                    out = acc.float().mul_(scale.unsqueeze(1)).mul_(self.weight_scale)
                    return (out if self.bias is None else out.add_(self.bias)).to(dtype)
            else:
                return torch._scaled_mm(q, self.weight_q.t(), scale_a=scale.unsqueeze(1), scale_b=self.weight_scale,
                                        bias=self.bias, out_dtype=dtype)
        out = F.linear(dequantize_rows(q, scale), dequantize_rows(self.weight_q, self.weight_scale.squeeze(0)),
                       None if self.bias is None else self.bias.float())
        return out.to(dtype)
