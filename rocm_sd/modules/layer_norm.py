"""RocmLayerNorm: an nn.LayerNorm drop-in (last dimension) running rocm_sd::layer_norm."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.layer_norm import layer_norm


class RocmLayerNorm(nn.LayerNorm):
    """Same parameters and state-dict keys as the nn.LayerNorm it replaces (shared, not copied)."""

    @classmethod
    def from_layer_norm(cls, module: nn.LayerNorm) -> "RocmLayerNorm":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.normalized_shape, new.eps, new.elementwise_affine = (module.normalized_shape, module.eps,
                                                                 module.elementwise_affine)
        new.weight, new.bias = module.weight, module.bias
        new.train(module.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm.call(x, self.weight, self.bias, self.eps)
