"""The `linear_8bit` problems: per 8-bit layer shape, whether its 8-bit GEMM pays against the fp16 one.

optimize(precision="fp8" | "int8") turns every linear layer 8-bit; with precision_layers="measured" each goes back to
fp16 at its first call where the database says `torch` for its problem (modules/quantized_linear.linear_8bit_key:
rows, in and out features, how many layers share its quantized input, and who quantizes it). The tuner's
`--precision` pass records those problems from the model's real calls and times, each on inputs cycling through
more memory than the L2 cache:

    torch           the fp16 (bf16, fp32) GEMM with bias: F.linear
    <format>        the 8-bit GEMM from quantized rows, plus the layer's share (1 / sharers) of quantizing its input:
                    input=rows   a quantize_rows pass
                    input=norm   what writing it costs a LayerNorm: layer_norm_quantize_rows minus layer_norm (a
                                 SkipLayerNorm's is within a microsecond of it at these shapes)
                    input=geglu  geglu_quantized minus geglu, on the GEGLU's (rows, 2 x features) input: below
                                 zero, since a GEGLU that writes only the 8-bit rows (modules/geglu.py
                                 feed_forward_8bit) moves fewer bytes than one writing fp16
                    input=norm-tensor, geglu-tensor: the same with a bound (one scale for the input), and the GEMM
                                 per tensor (precision_scales="tensor")
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dispatch import TORCH
from ..modules.quantized_linear import (RocmQuantizedLinear, input_sharing, linear_8bit, linear_8bit_key,
                                        one_scale, quantize_weight)
from ..op_names import LINEAR_8BIT
from ..ops import REGISTRY
from ..timing import graph_device_ms
from .measure import MAX_COPIES

OP = LINEAR_8BIT
EPS = 1e-5
BOUND = 64.0  # any bound: the kernels' time does not depend on it


@dataclass(frozen=True)
class Linear8bitCall:
    dtype: torch.dtype
    format: str
    rows: int
    in_features: int
    out_features: int
    sharers: int
    quantizer: str

    @property
    def key(self) -> str:
        return linear_8bit_key(self.dtype, self.format, self.rows, self.in_features, self.out_features, self.sharers,
                               self.quantizer)

    @property
    def candidates(self) -> tuple[str, str]:
        return TORCH, self.format


@contextmanager
def recording(model: torch.nn.Module):
    """Records every 8-bit layer call of `model` while inside (a dict Linear8bitCall -> calls, filled in place)."""
    calls: dict[Linear8bitCall, int] = {}

    def record(layer: RocmQuantizedLinear, args: tuple) -> None:
        x = args[0]
        # The layer as it runs outside inference mode (the tuner's harvest is inside it), as it runs here, and as it
        # would with nobody to share or fuse its quantization: ComfyUI's layers (its GEGLU is its own), and diffusers'
        # when a neighbour went back to fp16.
        declared = (layer.input_sharers, layer.input_quantizer)
        for variant in {declared, input_sharing(x, *declared), (1, "rows")}:
            call = Linear8bitCall(x.dtype, layer.format, x.numel() // layer.in_features, layer.in_features,
                                  layer.out_features, *variant)
            calls[call] = calls.get(call, 0) + 1

    handles = [m.register_forward_pre_hook(record) for m in model.modules() if isinstance(m, RocmQuantizedLinear)]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def _quantizing_ms(call: Linear8bitCall, device: torch.device, copies: int, gen: torch.Generator) -> float:
    """Device ms that quantizing the layer's (rows, in_features) input costs whoever does it (the module doc)."""
    m, k, fmt = call.rows, call.in_features, call.format
    producer, _, per_tensor = call.quantizer.partition("-")
    bound = BOUND if per_tensor else 0.0

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(call.dtype)

    if producer == "geglu":
        inputs = [(randn(m, 2 * k),) for _ in range(copies)]
        fused = graph_device_ms(lambda h: REGISTRY["geglu_quantized"].call(h, fmt, bound), inputs)
        return fused - graph_device_ms(lambda h: REGISTRY["geglu"].call(h), inputs)
    inputs = [(randn(m, k),) for _ in range(copies)]
    if producer == "norm":
        weight, bias = randn(k), randn(k)
        fused = graph_device_ms(lambda x: REGISTRY["layer_norm_quantize_rows"].call(x, weight, bias, EPS, fmt, bound),
                                inputs)
        return max(0.0, fused - graph_device_ms(lambda x: REGISTRY["layer_norm"].call(x, weight, bias, EPS), inputs))
    return graph_device_ms(lambda x: REGISTRY["quantize_rows"].call(x, fmt), inputs)


def measure_parts(call: Linear8bitCall, device: torch.device, l2_bytes: int, seed: int = 0) -> dict[str, float]:
    """Device ms of the fp16 GEMM (`torch`), the 8-bit GEMM (`gemm`) and quantizing its input (`input`): what a
    problem's result is made of, the same whatever its sharers."""
    gen = torch.Generator(device).manual_seed(seed)
    m, k, n = call.rows, call.in_features, call.out_features
    weight = torch.randn(n, k, device=device, generator=gen).to(call.dtype) / k ** 0.5
    bias = torch.randn(n, device=device, generator=gen).to(call.dtype)
    per_tensor = call.quantizer.endswith("-tensor")
    weight_q, weight_scale = quantize_weight(weight, call.format, per_tensor=per_tensor)
    copies = max(1, min(MAX_COPIES, -(-2 * l2_bytes // max(m * k * 2, 1))))
    xs = [(torch.randn(m, k, device=device, generator=gen).to(call.dtype),) for _ in range(copies)]
    rows = [REGISTRY["quantize_rows"].call(x, call.format) for (x,) in xs]
    if per_tensor:  # the GEMM's time does not depend on which scale it applies
        rows = [(q, one_scale(scale, BOUND)) for q, scale in rows]
    return {TORCH: graph_device_ms(lambda x: F.linear(x, weight, bias), xs),
            "gemm": graph_device_ms(lambda q, s: linear_8bit(q, s, weight_q, weight_scale, bias, call.format,
                                                             call.dtype), rows),
            "input": _quantizing_ms(call, device, copies, gen)}


def result(call: Linear8bitCall, parts: dict[str, float], calls_per_run: int) -> dict:
    """The database result of one problem from its parts: the faster candidate, both times, and the 8-bit one's
    parts."""
    torch_ms = parts[TORCH]
    times = {TORCH: torch_ms, call.format: parts["gemm"] + parts["input"] / call.sharers}
    ranked = sorted(times.items(), key=lambda kv: kv[1])
    return {"choice": ranked[0][0], "ms": round(ranked[0][1], 5), "torch_ms": round(torch_ms, 5),
            "speedup_vs_torch": round(torch_ms / ranked[0][1], 3),
            "runners_up": [[name, round(ms, 5)] for name, ms in ranked[1:]], "rejected": {},
            "calls_per_run": calls_per_run,
            "parts_ms": {"gemm": round(parts["gemm"], 5), "input": round(parts["input"], 5),
                         "sharers": call.sharers}}


def measure(call: Linear8bitCall, device: torch.device, l2_bytes: int, calls_per_run: int, measured: dict) -> dict:
    """The database result of one problem. `measured` (one dict per tuning run) keeps each layer shape's parts, so
    that its variants with other sharers are not timed again."""
    shape = (call.dtype, call.format, call.rows, call.in_features, call.out_features, call.quantizer)
    if shape not in measured:
        measured[shape] = measure_parts(call, device, l2_bytes)
    return result(call, measured[shape], calls_per_run)
