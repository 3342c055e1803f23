"""RocmLayerNorm: an nn.LayerNorm drop-in (last dimension) running rocm_sd::layer_norm."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.layer_norm import layer_norm
from ..ops.quantized_outputs import layer_norm_quantize_rows, layer_norm_quantized
from .quantized_linear import one_scale, remember_rows, rows_stand_in


class RocmLayerNorm(nn.LayerNorm):
    """Same parameters and state-dict keys as the nn.LayerNorm it replaces (shared, not copied).

    `quantized_output`: None, or the 8-bit format its every consumer multiplies in (patch/precision.py sets it): the
    kernel then also writes its output quantized per row, which those layers take instead of quantizing it.
    `quantized_bound`: 0, or a value its output cannot exceed (patch/precision.py: layer_norm_bound): one scale for the
    whole output, which per-tensor GEMMs take. `quantized_consumers`: those layers (patch/precision.py). `rows_only`
    writes only the rows, for a caller that knows nothing else reads the output (modules/transformer.py)."""

    quantized_output: str | None = None
    quantized_bound: float = 0.0
    quantized_consumers: tuple[nn.Module, ...] = ()

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
        if self.quantized_output is None:
            return layer_norm.call(x, self.weight, self.bias, self.eps)
        y, q, scale = layer_norm_quantize_rows.call(x, self.weight, self.bias, self.eps, self.quantized_output,
                                                    self.quantized_bound)
        remember_rows(y, self.quantized_output, q, one_scale(scale, self.quantized_bound), trusted=True)
        return y

    def rows_only(self, x: torch.Tensor) -> torch.Tensor:
        """The norm's quantized rows alone, held by a stand-in for its output (rows_stand_in): y is not written."""
        q, scale = layer_norm_quantized.call(x, self.weight, self.bias, self.eps, self.quantized_output,
                                             self.quantized_bound)
        return rows_stand_in(x.shape, x.dtype, self.quantized_output, q, one_scale(scale, self.quantized_bound))
