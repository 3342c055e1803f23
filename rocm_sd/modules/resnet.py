"""ResnetBlock2D with its elementwise passes fused into the kernels around its convolutions.

diffusers' forward (time_embedding_norm "default", or the VAE's "group" without a time embedding; no
up/down sampling), after the GroupNorm patch:
    h = silu(norm1(x)); h = conv1(h) [+ bias, a separate broadcast kernel on the cuDNN path]
    h = h + temb; h = silu(norm2(h)); h = conv2(h) [+ bias]; out = (shortcut(x) + h) / scale
Fused: conv1 and conv2 run without bias; norm2 takes conv1's bias plus the time embedding as its
per-(image, channel) input bias (rocm_sd::group_norm input_bias), conv1's bias folded into the time
projection's GEMM bias (summed once per weight version); conv2's bias, the residual add and the scale are
one rocm_sd::bias_residual. Four fewer passes over the activation per block, one fewer small add.
Same math; the additions happen in another order, so results differ by rounding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.bias_residual import bias_residual
from ..ops.conv_bias_residual import conv_bias_residual
from .fusing import called_plainly, derived
from .group_norm import RocmGroupNorm
from .quantized_conv import RocmQuantizedConv2d
from ..ops.conv_bias_residual import hosts_ck as conv_hosts_ck


def _plain_conv(conv) -> bool:
    return type(conv) is nn.Conv2d and conv.padding_mode == "zeros" and conv.bias is not None


def _weights_readable(conv) -> bool:
    """Still a plain nn.Conv2d called plainly (modules/fusing.py), so the fused path may read its weight and bias; or
    an FP8 one (optimize(precision="fp8"): modules/quantized_conv.py) with a bias, which convolves without it."""
    plain = _plain_conv(conv) or (type(conv) is RocmQuantizedConv2d and conv.bias is not None)
    return plain and called_plainly(conv)


def plain_time_embedding(block: nn.Module) -> bool:
    """Whether the block's forward runs norm2(h [+ time embedding]) then its nonlinearity: mode "default",
    or any mode but "scale_shift" without a time-embedding projection (the VAE decoder's up blocks are
    built with "group" and no time embedding: their forward takes the same path)."""
    mode = getattr(block, "time_embedding_norm", None)
    return mode == "default" or (mode not in (None, "scale_shift") and getattr(block, "time_emb_proj", 0) is None)


def fusable(block: nn.Module) -> bool:
    return (block.upsample is None and block.downsample is None and plain_time_embedding(block)
            and isinstance(block.norm1, RocmGroupNorm) and block.norm1.act == "silu"
            and isinstance(block.norm2, RocmGroupNorm) and block.norm2.act == "silu"
            and isinstance(block.nonlinearity, nn.Identity) and _plain_conv(block.conv1) and _plain_conv(block.conv2)
            and (block.conv_shortcut is None or isinstance(block.conv_shortcut, nn.Conv2d)))


CACHE_ATTR = "_rocm_sd_resnet_cache"  # tensors derived from the block's weights (core.derived)


def silu_temb(block, args, kwargs):
    """The forward pre-hook (with kwargs) the GroupNorm patch puts on a ResnetBlock2D whose `nonlinearity` it made
    Identity: the SiLU that nonlinearity applied to the time embedding before time_emb_proj, applied to the block's
    `temb` argument instead. On the argument, not as a hook of time_emb_proj: a LoRA loaded later replaces
    time_emb_proj by a wrapper whose low-rank branch must see the same SiLU input as its base layer."""
    if len(args) > 1 and args[1] is not None:
        return (args[0], F.silu(args[1])) + tuple(args[2:]), kwargs
    if kwargs.get("temb") is not None:
        return args, {**kwargs, "temb": F.silu(kwargs["temb"])}
    return None


def _plain_projection(proj: nn.Module, temb: torch.Tensor) -> bool:
    """time_emb_proj is a plain nn.Linear without hooks (no LoRA wrapper, no offload hook), and nothing is being
    traced: its projection can take the folded bias."""
    return (type(proj) is nn.Linear and proj.bias is not None and called_plainly(proj)
            and temb.dtype == proj.weight.dtype and not torch.compiler.is_compiling())


def _time_bias(block: nn.Module) -> torch.Tensor:
    """time_emb_proj.bias + conv1.bias, summed in fp32 once per weight version: both are added to every
    image's projection, so folding them into the GEMM's bias saves one add kernel per block and call."""
    proj_bias, conv_bias = block.time_emb_proj.bias, block.conv1.bias
    return derived(getattr(block, CACHE_ATTR), "time_bias", (proj_bias, conv_bias),
                   lambda: (proj_bias.float() + conv_bias.float()).to(proj_bias.dtype))


def _conv_without_bias(conv: nn.Conv2d | RocmQuantizedConv2d, x: torch.Tensor) -> torch.Tensor:
    if type(conv) is RocmQuantizedConv2d:
        return conv.convolve(x, with_bias=False)
    return F.conv2d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)


def resnet_forward(self, input_tensor: torch.Tensor, temb: torch.Tensor | None, *args, **kwargs) -> torch.Tensor:
    if not (_weights_readable(self.conv1) and _weights_readable(self.conv2)):  # read directly below
        return type(self).forward(self, input_tensor, temb, *args, **kwargs)
    hidden = _conv_without_bias(self.conv1, self.norm1(input_tensor))
    proj = self.time_emb_proj
    if proj is not None and temb is not None and _plain_projection(proj, temb):
        # The projection with conv1's bias folded into its own (the GEMM epilogue adds both).
        input_bias = F.linear(temb, proj.weight, _time_bias(self))  # temb: after the block's silu_temb hook
    elif proj is not None and temb is not None:
        input_bias = proj(temb) + self.conv1.bias
    else:  # no time embedding (the VAE): conv1's bias for every image, made once per batch size
        bias, n = self.conv1.bias, hidden.shape[0]
        input_bias = derived(getattr(self, CACHE_ATTR), "conv1_bias_rows", (bias,),
                             lambda: bias.expand(n, -1).contiguous(), n)
    hidden = self.dropout(self.norm2(hidden, input_bias=input_bias.to(hidden.dtype).contiguous()))
    shortcut = self.conv_shortcut(input_tensor) if self.conv_shortcut is not None else input_tensor
    conv2, scale = self.conv2, 1.0 / self.output_scale_factor
    if conv_hosts_ck() and type(conv2) is nn.Conv2d and _unit_stride(conv2):
        # Builds with CK instances: conv2 and its tail as one op, so the tuner can pick a fused CK convolution.
        return conv_bias_residual.call(hidden, conv2.weight, conv2.bias, shortcut, scale, *conv2.padding)
    return bias_residual.call(_conv_without_bias(conv2, hidden), shortcut, conv2.bias, scale)


def _unit_stride(conv: nn.Conv2d) -> bool:
    """Stride 1, dilation 1, one group and numeric padding: what rocm_sd::conv_bias_residual takes."""
    return conv.stride == (1, 1) and conv.dilation == (1, 1) and conv.groups == 1 and \
        not isinstance(conv.padding, str)
