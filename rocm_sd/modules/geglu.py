"""RocmGEGLU: diffusers' GEGLU (projection, then x * gelu(gate)) with the epilogue in one kernel."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.geglu import geglu
from ..ops.linear_geglu import hosts_ck as linear_geglu_hosts_ck
from ..ops.linear_geglu import linear_geglu
from ..ops.quantized_outputs import geglu_quantize_rows, geglu_quantized
from .fusing import called_plainly
from .quantized_linear import RocmQuantizedLinear, one_scale, remember_rows, takes_rows_for_good


class RocmGEGLU(nn.Module):
    """Holds the replaced GEGLU's `proj` (same parameters and state-dict keys: `proj.weight`,
    `proj.bias`). `quantized_output`, `quantized_bound`: as RocmLayerNorm's (the output projection multiplies in 8
    bits; patch/precision.py: geglu_bound)."""

    quantized_output: str | None = None
    quantized_bound: float = 0.0

    def __init__(self, proj: nn.Linear):
        super().__init__()
        self.proj = proj

    @classmethod
    def from_geglu(cls, module: nn.Module) -> "RocmGEGLU":
        new = cls(module.proj)
        new.train(module.training)
        return new

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        proj = self.proj
        if self.quantized_output is not None:
            y, q, scale = geglu_quantize_rows.call(proj(hidden_states), self.quantized_output, self.quantized_bound)
            remember_rows(y, self.quantized_output, q, one_scale(scale, self.quantized_bound), trusted=True)
            return y
        if linear_geglu_hosts_ck() and _plain_linear(proj):
            # Builds with CK instances: projection and epilogue as one op, so the tuner can pick a fused CK pair.
            return linear_geglu.call(hidden_states, proj.weight, proj.bias)
        return geglu.call(proj(hidden_states))


def _plain_linear(proj: nn.Module) -> bool:
    """An nn.Linear with a bias, called plainly (hooks.py): its forward is F.linear."""
    return type(proj) is nn.Linear and proj.bias is not None and called_plainly(proj)


def feeds_8bit_directly(ff: nn.Module) -> bool:
    """A diffusers FeedForward whose GEGLU writes its output quantized for the 8-bit output layer after it, with only
    a Dropout between them: feed_forward_8bit can hand the quantized rows over without y."""
    net = getattr(ff, "net", None)
    return (net is not None and len(net) >= 3 and isinstance(net[0], RocmGEGLU) and net[0].quantized_output is not None
            and type(net[1]) is nn.Dropout and isinstance(net[2], RocmQuantizedLinear) and not net[2].conv
            and net[2].format == net[0].quantized_output)


def feed_forward_8bit(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """diffusers' FeedForward (GEGLU, Dropout, Linear, ...) where the output layer runs its 8-bit GEMM for good: the
    GEGLU writes only its output's 8-bit rows (rocm_sd::geglu_quantized, no y) and the output layer multiplies them.
    Until the layer's measured choice is made, or where it went back to fp16, after the GEGLU stopped writing 8-bit
    rows, with a dropout that drops, with hooks on the layers or extra arguments: diffusers' forward."""
    geglu, dropout, out_layer = self.net[0], self.net[1], self.net[2]
    fmt = geglu.quantized_output
    if (args or kwargs or fmt is None or not takes_rows_for_good([out_layer], fmt)
            or (dropout.training and dropout.p > 0) or not (called_plainly(geglu) and called_plainly(dropout))):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    q, scale = geglu_quantized.call(geglu.proj(hidden_states), fmt, geglu.quantized_bound)
    out = out_layer.multiply_rows(q, one_scale(scale, geglu.quantized_bound), hidden_states.dtype)
    for module in self.net[3:]:
        out = module(out)
    return out
