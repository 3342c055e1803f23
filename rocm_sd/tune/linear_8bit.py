"""The `linear_8bit` problems: per 8-bit layer shape, whether its 8-bit GEMM pays against the fp16 one.

optimize(precision="fp8" | "int8") turns every linear layer 8-bit; with precision_layers="measured" each goes back to
fp16 at its first call where the database says `torch` for its problem (modules/quantized_linear.linear_8bit_key:
rows, in and out features, and how many layers share its quantized input). The tuner's `--precision` pass records
those problems from the model's real calls and times, each on inputs cycling through more memory than the L2 cache:

    torch           the fp16 (bf16, fp32) GEMM with bias: F.linear
    <format>        the 8-bit GEMM from quantized rows, plus quantize_rows of its input divided by the sharers

The quantization a norm or GEGLU fuses into its own kernel (ops/quantized_outputs.py) costs that kernel less than a
quantize_rows pass of its output; charging the whole pass keeps the choice on the side of fp16 where the two are close.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dispatch import TORCH
from ..modules.quantized_linear import RocmQuantizedLinear, linear_8bit, linear_8bit_key, quantize_weight
from ..ops import REGISTRY
from ..timing import graph_device_ms
from .measure import MAX_COPIES

OP = "linear_8bit"
quantize_rows = REGISTRY["quantize_rows"]


@dataclass(frozen=True)
class Linear8bitCall:
    dtype: torch.dtype
    format: str
    rows: int
    in_features: int
    out_features: int
    sharers: int

    @property
    def key(self) -> str:
        return linear_8bit_key(self.dtype, self.format, self.rows, self.in_features, self.out_features, self.sharers)

    @property
    def candidates(self) -> tuple[str, str]:
        return TORCH, self.format


@contextmanager
def recording(model: torch.nn.Module):
    """Records every 8-bit layer call of `model` while inside (a dict Linear8bitCall -> calls, filled in place)."""
    calls: dict[Linear8bitCall, int] = {}

    def record(layer: RocmQuantizedLinear, args: tuple) -> None:
        x = args[0]
        call = Linear8bitCall(x.dtype, layer.format, x.numel() // layer.in_features, layer.in_features,
                              layer.out_features, layer.input_sharers)
        calls[call] = calls.get(call, 0) + 1

    handles = [m.register_forward_pre_hook(record) for m in model.modules() if isinstance(m, RocmQuantizedLinear)]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def measure(call: Linear8bitCall, device: torch.device, l2_bytes: int, calls_per_run: int, seed: int = 0) -> dict:
    """The database result of one problem: the faster candidate, both times, and the 8-bit one's parts."""
    gen = torch.Generator(device).manual_seed(seed)
    m, k, n = call.rows, call.in_features, call.out_features
    weight = torch.randn(n, k, device=device, generator=gen).to(call.dtype) / k ** 0.5
    bias = torch.randn(n, device=device, generator=gen).to(call.dtype)
    weight_q, weight_scale = quantize_weight(weight, call.format)
    copies = max(1, min(MAX_COPIES, -(-2 * l2_bytes // max(m * k * 2, 1))))
    xs = [(torch.randn(m, k, device=device, generator=gen).to(call.dtype),) for _ in range(copies)]
    rows = [quantize_rows.call(x, call.format) for (x,) in xs]

    torch_ms = graph_device_ms(lambda x: F.linear(x, weight, bias), xs)
    gemm_ms = graph_device_ms(lambda q, s: linear_8bit(q, s, weight_q, weight_scale, bias, call.format, call.dtype),
                              rows)
    quantize_ms = graph_device_ms(lambda x: quantize_rows.call(x, call.format), xs)
    eight_bit_ms = gemm_ms + quantize_ms / call.sharers
    times = {TORCH: torch_ms, call.format: eight_bit_ms}
    ranked = sorted(times.items(), key=lambda kv: kv[1])
    return {"choice": ranked[0][0], "ms": round(ranked[0][1], 5), "torch_ms": round(torch_ms, 5),
            "speedup_vs_torch": round(torch_ms / ranked[0][1], 3),
            "runners_up": [[name, round(ms, 5)] for name, ms in ranked[1:]], "rejected": {},
            "calls_per_run": calls_per_run,
            "parts_ms": {"gemm": round(gemm_ms, 5), "quantize_rows": round(quantize_ms, 5), "sharers": call.sharers}}
