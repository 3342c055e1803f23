"""Upsample2D's nearest 2x upsampling and the 3x3 convolution after it, as one 2x2 convolution at the input's
resolution: the same result with 2.25x fewer multiply-adds and no 4x-sized intermediate.

Nearest 2x upsampling repeats each input pixel in a 2x2 block, so output pixel (2i + a, 2j + b) of the
3x3 convolution sees input rows {i - 1, i} (a = 0) or {i, i + 1} (a = 1), and likewise columns: its 3x3
taps fold into a 2x2 kernel per parity (a, b) (e.g. for a = 0 the kernel rows are W[0] and W[1] + W[2]).
The four parities' 2x2 kernels run as one convolution with 4 x C_out output channels over the input padded
by one pixel, and the "pixel shuffle" puts each parity's pixels in place and adds the bias:
rocm_sd::parity_shuffle (one pass) for channels_last activations, its PyTorch reference otherwise. The folded
kernels are summed in fp32 and cached per weight version; results differ from diffusers' by rounding.

Covered: diffusers' Upsample2D with a 3x3, stride 1, zero padding 1 convolution after nearest 2x interpolation
(the SD UNet's and the VAE decoder's up blocks), and ComfyUI's VAE Upsample through patch/comfy.py. Anything
else (an explicit output size other than 2x, norms, transposed convolutions, torch.compile tracing, another
padding mode: the fold assumes zeros outside the image, so a convolution set to "circular" after patching, as the
webui's tiling and ComfyUI's seamless-tiling nodes do, is checked at every call) runs the host's own forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.parity_shuffle import parity_shuffle
from ..ops.parity_shuffle import parity_shuffle_ref
from .fusing import called_plainly, derived

CACHE_ATTR = "_rocm_sd_folded_conv"

# Which 3x3 kernel rows (or columns) fold into each of the two taps of parity 0 and parity 1.
_TAPS = {0: ((0,), (1, 2)), 1: ((0, 1), (2,))}


def _conv_of(module: nn.Module):
    return module.conv if module.name == "conv" else module.Conv2d_0


def conv_foldable(conv) -> bool:
    """A 3x3, stride 1, padding 1 convolution (any nn.Conv2d subclass; callers decide which they accept)."""
    return (isinstance(conv, nn.Conv2d) and conv.kernel_size == (3, 3) and conv.stride == (1, 1)
            and conv.padding == (1, 1) and conv.dilation == (1, 1) and conv.groups == 1
            and conv.padding_mode == "zeros")


def fusable(module: nn.Module) -> bool:
    conv = _conv_of(module)
    return (module.use_conv and not module.use_conv_transpose and module.interpolate and module.norm is None
            and type(conv) is nn.Conv2d and conv_foldable(conv))


def fold_weight(weight: torch.Tensor) -> torch.Tensor:
    """(C_out, C_in, 3, 3) -> (4 C_out, C_in, 2, 2): parity (a, b)'s 2x2 kernel in output block 2a + b."""
    w = weight.float()
    blocks = []
    for a in (0, 1):
        rows = torch.stack([w[:, :, list(taps), :].sum(2) for taps in _TAPS[a]], dim=2)  # (C_out, C_in, 2, 3)
        for b in (0, 1):
            blocks.append(torch.stack([rows[:, :, :, list(taps)].sum(3) for taps in _TAPS[b]], dim=3))
    return torch.cat(blocks).to(weight.dtype)


def folded_upsample_conv(x: torch.Tensor, conv: nn.Conv2d, cache: dict) -> torch.Tensor:
    """conv(nearest_2x(x)) for a 4-D x of conv's dtype, through the folded 2x2 kernels; `cache` keeps them
    (core.derived: refolded when the weights change, e.g. a LoRA is fused)."""
    memory_format = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() \
        else torch.contiguous_format
    weight = derived(cache, "folded_weight", (conv.weight,),
                     lambda: fold_weight(conv.weight).contiguous(memory_format=memory_format), memory_format)
    parities = F.conv2d(x, weight, None, padding=1)  # (N, 4 C_out, H + 1, W + 1), x's layout
    if memory_format == torch.channels_last:  # one kernel, the bias added on the way
        return parity_shuffle.call(parities, conv.bias)
    return parity_shuffle_ref(parities, conv.bias)  # NCHW: the kernel takes channels_last only


def upsample_forward(self, hidden_states: torch.Tensor, output_size=None, *args, **kwargs) -> torch.Tensor:
    conv = _conv_of(self)
    h, w = hidden_states.shape[-2:] if hidden_states.dim() == 4 else (0, 0)
    if (args or kwargs or hidden_states.dim() != 4 or (output_size is not None and tuple(output_size) != (2 * h, 2 * w))
            or not (conv_foldable(conv) and called_plainly(conv))  # at call time: a padding mode set since
            or hidden_states.dtype != conv.weight.dtype
            or torch.compiler.is_compiling()):  # the weight cache cannot be traced; the compiler fuses its own way
        return type(self).forward(self, hidden_states, output_size, *args, **kwargs)
    return folded_upsample_conv(hidden_states, conv, getattr(self, CACHE_ATTR))
