"""GEGLUFused: diffusers' GEGLU (projection, then x * gelu(gate)) with the epilogue in one kernel."""
from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..ops.geglu import geglu_ref


class GEGLUFused(nn.Module):
    """Holds the replaced GEGLU's `proj` (same parameters and state-dict keys: `proj.weight`,
    `proj.bias`). Calls that need gradients use PyTorch's differentiable ops; the kernel is forward-only."""

    def __init__(self, proj: nn.Linear):
        super().__init__()
        self.proj = proj

    @classmethod
    def from_geglu(cls, module: nn.Module) -> "GEGLUFused":
        new = cls(module.proj)
        new.train(module.training)
        return new

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        x = self.proj(hidden_states)
        if torch.is_grad_enabled() and x.requires_grad:
            return geglu_ref(x)
        return ops.geglu.call(x)

    def _get_name(self) -> str:
        return "RocmGEGLU"
