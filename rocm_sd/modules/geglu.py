"""RocmGEGLU: diffusers' GEGLU (projection, then x * gelu(gate)) with the epilogue in one kernel."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.geglu import geglu
from ..ops.linear_geglu import hosts_ck as linear_geglu_hosts_ck
from ..ops.linear_geglu import linear_geglu
from ..ops.quantized_outputs import geglu_quantize_rows
from .fusing import called_plainly
from .quantized_linear import remember_rows


class RocmGEGLU(nn.Module):
    """Holds the replaced GEGLU's `proj` (same parameters and state-dict keys: `proj.weight`,
    `proj.bias`). `quantized_output`: as RocmLayerNorm's (the output projection multiplies in 8 bits)."""

    quantized_output: str | None = None

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
            y, q, scale = geglu_quantize_rows.call(proj(hidden_states), self.quantized_output)
            remember_rows(y, self.quantized_output, q, scale, trusted=True)
            return y
        if linear_geglu_hosts_ck() and _plain_linear(proj):
            # Builds with CK instances: projection and epilogue as one op, so the tuner can pick a fused CK pair.
            return linear_geglu.call(hidden_states, proj.weight, proj.bias)
        return geglu.call(proj(hidden_states))


def _plain_linear(proj: nn.Module) -> bool:
    """An nn.Linear with a bias, called plainly (hooks.py): its forward is F.linear."""
    return type(proj) is nn.Linear and proj.bias is not None and called_plainly(proj)
