"""RocmGroupNorm: an nn.GroupNorm drop-in running rocm_sd::group_norm, optionally with SiLU fused."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.group_norm import group_norm

ACTIVATIONS = (None, "silu")


class RocmGroupNorm(nn.GroupNorm):
    """nn.GroupNorm followed by an optional activation, in one kernel.

    A subclass of nn.GroupNorm with the same parameters and state-dict keys, so weights load, LoRA
    patches and `.to()` behave as on the module it replaces.
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 act: str | None = None, device=None, dtype=None):
        super().__init__(num_groups, num_channels, eps, affine, device=device, dtype=dtype)
        if act not in ACTIVATIONS:
            raise ValueError(f"act must be one of {ACTIVATIONS}, not {act!r}")
        self.act = act

    @classmethod
    def from_group_norm(cls, module: nn.GroupNorm, act: str | None = None) -> "RocmGroupNorm":
        """A RocmGroupNorm sharing `module`'s parameters (no copy)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.num_groups, new.num_channels, new.eps, new.affine = (module.num_groups, module.num_channels,
                                                                 module.eps, module.affine)
        new.weight, new.bias = module.weight, module.bias
        new.act = act
        new.train(module.training)
        return new

    def forward(self, x: torch.Tensor, input_bias: torch.Tensor | None = None) -> torch.Tensor:
        """input_bias: (N, C), added to x per image and channel before normalising (one pass, no extra
        tensor), as ResnetBlock2D adds its conv bias and time embedding."""
        silu = self.act == "silu"
        return group_norm.call(x, self.num_groups, self.weight, self.bias, self.eps, silu, input_bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", act={self.act}" if self.act else "")

    def _get_name(self) -> str:
        return "RocmGroupNorm" + ("SiLU" if self.act == "silu" else "")
