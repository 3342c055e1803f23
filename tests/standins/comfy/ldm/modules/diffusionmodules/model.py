"""comfy.ldm.modules.diffusionmodules.model: the VAE's AttnBlock with its per-instance attention function,
ResnetBlock, Upsample, and a decoder reduced to the modules the rocm_sd VAE node touches."""
import torch
import torch.nn.functional as F
from torch import nn

from comfy import ops


def Normalize(in_channels, num_groups=8):
    return ops.disable_weight_init.GroupNorm(num_groups=num_groups, num_channels=in_channels, eps=1e-6, affine=True)


def nonlinearity(x):
    return x * torch.sigmoid(x)


def pytorch_attention(q, k, v):
    orig_shape = q.shape
    b, c = orig_shape[0], orig_shape[1]
    q, k, v = map(lambda t: t.view(b, 1, c, -1).transpose(2, 3).contiguous(), (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
    return out.transpose(2, 3).reshape(orig_shape)


def vae_attention():
    return pytorch_attention


class AttnBlock(nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.norm = Normalize(in_channels)
        self.q, self.k, self.v, self.proj_out = (ops.disable_weight_init.Conv2d(in_channels, in_channels, 1)
                                                 for _ in range(4))
        self.optimized_attention = vae_attention()

    def forward(self, x):
        h_ = self.norm(x)
        h_ = self.optimized_attention(self.q(h_), self.k(h_), self.v(h_))
        return x + self.proj_out(h_)


class ResnetBlock(nn.Module):
    """As ComfyUI's: the activation is the module `swish` (an in-place SiLU), also applied to the time
    embedding when the block has one (`temb_proj`, temb_channels > 0; the VAE's blocks have none)."""

    def __init__(self, channels, temb_channels=0):
        super().__init__()
        self.swish = nn.SiLU(inplace=True)
        self.norm1, self.norm2 = Normalize(channels), Normalize(channels)
        self.conv1 = ops.disable_weight_init.Conv2d(channels, channels, 3, padding=1)
        if temb_channels > 0:
            self.temb_proj = ops.disable_weight_init.Linear(temb_channels, channels)
        self.dropout = nn.Dropout(0.0, inplace=True)
        self.conv2 = ops.disable_weight_init.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, temb=None):
        h = self.conv1(self.swish(self.norm1(x)))
        if temb is not None:
            h = h + self.temb_proj(self.swish(temb))[:, :, None, None]
        h = self.conv2(self.dropout(self.swish(self.norm2(h))))
        return x + h


class Upsample(nn.Module):
    """As ComfyUI's: nearest 2x interpolation, then a 3x3 convolution when with_conv."""

    def __init__(self, in_channels, with_conv):
        super().__init__()
        self.with_conv = with_conv
        if with_conv:
            self.conv = ops.disable_weight_init.Conv2d(in_channels, in_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x):
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.conv(x) if self.with_conv else x


class Decoder(nn.Module):
    def __init__(self, channels=16):
        super().__init__()
        self.conv_in = ops.disable_weight_init.Conv2d(4, channels, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.attn_1, self.mid.block_2 = (ResnetBlock(channels), AttnBlock(channels),
                                                                ResnetBlock(channels))
        self.up = nn.ModuleList([nn.Module()])
        self.up[0].upsample = Upsample(channels, with_conv=True)
        self.norm_out = Normalize(channels)
        self.conv_out = ops.disable_weight_init.Conv2d(channels, 3, 3, padding=1)

    def forward(self, z):
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z), None)), None)
        h = self.up[0].upsample(h)
        return self.conv_out(nonlinearity(self.norm_out(h)))
