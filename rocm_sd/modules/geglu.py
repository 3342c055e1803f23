"""GEGLUFused: diffusers' GEGLU (projection, then x * gelu(gate)) with the epilogue in one kernel."""
from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..ops.linear_geglu import hosts_ck as linear_geglu_hosts_ck
from ..ops.geglu import geglu_ref
from .hooks import called_plainly


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
        proj = self.proj
        if linear_geglu_hosts_ck() and _plain_linear(proj) and not (
                torch.is_grad_enabled() and (hidden_states.requires_grad or proj.weight.requires_grad)):
            # Builds with CK instances: projection and epilogue as one op, so the tuner can pick a fused CK pair.
            return ops.linear_geglu.call(hidden_states, proj.weight, proj.bias)
        x = proj(hidden_states)
        if torch.is_grad_enabled() and x.requires_grad:
            return geglu_ref(x)
        return ops.geglu.call(x)

    def _get_name(self) -> str:
        return "RocmGEGLU"


def _plain_linear(proj: nn.Module) -> bool:
    """An nn.Linear with a bias, called plainly (hooks.py): its forward is F.linear."""
    return type(proj) is nn.Linear and proj.bias is not None and called_plainly(proj)
