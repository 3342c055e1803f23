"""RocmRMSNorm: T5's RMSNorm (transformers' T5LayerNorm) running rocm_sd::rms_norm."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.rms_norm import rms_norm


class RocmRMSNorm(nn.Module):
    """Same parameter (shared, not copied) and state-dict key as the T5LayerNorm it replaces: the rows of x (..., C)
    as one head of C channels for rocm_sd::rms_norm."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = norm.variance_epsilon

    @classmethod
    def from_t5_layer_norm(cls, norm: nn.Module) -> "RocmRMSNorm":
        return cls(norm)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype != hidden_states.dtype:  # mixed precision: T5LayerNorm's own steps and output dtype
            variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            if self.weight.dtype in (torch.float16, torch.bfloat16):
                hidden_states = hidden_states.to(self.weight.dtype)
            return self.weight * hidden_states
        if hidden_states.dim() != 3:  # rows of another rank: as rows of one sequence
            return self.forward(hidden_states.reshape(1, -1, hidden_states.shape[-1])).view(hidden_states.shape)
        return rms_norm.call(hidden_states.unsqueeze(2), self.weight, self.variance_epsilon).squeeze(2)
