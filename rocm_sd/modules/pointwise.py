"""1x1 convolutions on channels_last activations as one GEMM with the bias in its epilogue.

Over NHWC memory a 1x1 convolution is exactly the matrix product [N*H*W, Cin] x [Cin, Cout]. For
channels_last tensors cuDNN runs it as an implicit GEMM and PyTorch adds the bias in a separate
broadcast kernel (dozens per SD1.5 UNet evaluation: bench/notes/sd15.md). F.linear on the permuted view reaches cuBLASLt/hipBLASLt with the bias fused into the GEMM,
and its output, permuted back, is channels_last again: no copy. The transformer blocks' proj_in/proj_out
of SD1.x and the resnets' 1x1 shortcuts are such convolutions. Inputs in another layout run the convolution as
before.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn



class RocmPointwiseConv2d(nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
            weight = self.weight.reshape(self.out_channels, self.in_channels)
            return F.linear(x.permute(0, 2, 3, 1), weight, self.bias).permute(0, 3, 1, 2)
        return super().forward(x)


def is_pointwise(conv: nn.Module, any_class: bool = False) -> bool:
    """A 1x1 convolution that is a GEMM over the pixels: a plain nn.Conv2d (optimize() replaces the module's class),
    or with any_class one of any Conv2d class (a host app's own, kept by host copies)."""
    return ((isinstance(conv, nn.Conv2d) if any_class else type(conv) is nn.Conv2d)
            and conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.padding in ((0, 0), "valid")
            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding_mode == "zeros")
