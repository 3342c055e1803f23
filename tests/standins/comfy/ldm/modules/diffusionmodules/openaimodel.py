"""comfy.ldm.modules.diffusionmodules.openaimodel: ResBlock and a UNetModel reduced to the structure the
rocm_sd node walks (input/middle/output blocks, ResBlocks with GroupNorm+SiLU Sequentials, spatial
transformers, the `out` head), with ComfyUI's transformer_options bookkeeping."""
import torch
from torch import nn

from comfy import ops
from comfy.ldm.modules.attention import BasicTransformerBlock


class ResBlock(nn.Module):
    def __init__(self, channels, out_channels, use_scale_shift_norm=False, operations=ops.disable_weight_init):
        super().__init__()
        self.use_scale_shift_norm = use_scale_shift_norm
        self.in_layers = nn.Sequential(operations.GroupNorm(8, channels), nn.SiLU(),
                                       operations.Conv2d(channels, out_channels, 3, padding=1))
        self.out_layers = nn.Sequential(operations.GroupNorm(8, out_channels), nn.SiLU(), nn.Dropout(0.0),
                                        operations.Conv2d(out_channels, out_channels, 3, padding=1))
        self.skip = nn.Identity() if channels == out_channels else operations.Conv2d(channels, out_channels, 1)

    def forward(self, x, scale_shift=None):
        in_rest, in_conv = self.in_layers[:-1], self.in_layers[-1]
        h = in_conv(in_rest(x))
        if self.use_scale_shift_norm:
            out_norm, out_rest = self.out_layers[0], self.out_layers[1:]
            scale, shift = scale_shift
            h = out_rest(out_norm(h) * (1 + scale) + shift)
        else:
            h = self.out_layers(h)
        return self.skip(x) + h


class SpatialTransformer(nn.Module):
    def __init__(self, channels, n_heads, d_head, depth, context_dim, operations=ops.disable_weight_init):
        super().__init__()
        self.norm = operations.GroupNorm(8, channels, eps=1e-6)
        self.proj_in = operations.Linear(channels, n_heads * d_head)
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(n_heads * d_head, n_heads, d_head, context_dim, operations) for _ in range(depth))
        self.proj_out = operations.Linear(n_heads * d_head, channels)

    def forward(self, x, context=None, transformer_options={}):
        b, c, h, w = x.shape
        x_in = x
        x = self.proj_in(self.norm(x).permute(0, 2, 3, 1).reshape(b, h * w, c))
        for i, block in enumerate(self.transformer_blocks):
            transformer_options["block_index"] = i
            x = block(x, context=context, transformer_options=transformer_options)
            if "transformer_index" in transformer_options:
                transformer_options["transformer_index"] += 1
        return self.proj_out(x).reshape(b, h, w, c).permute(0, 3, 1, 2) + x_in


class UNetModel(nn.Module):
    def __init__(self, channels=16, context_dim=24, operations=ops.disable_weight_init, use_scale_shift_norm=False):
        super().__init__()
        c = channels
        self.input_blocks = nn.ModuleList([nn.ModuleList([operations.Conv2d(4, c, 3, padding=1)]),
                                           nn.ModuleList([ResBlock(c, c, use_scale_shift_norm, operations),
                                                          SpatialTransformer(c, 2, c // 2, 1, context_dim, operations)])])
        self.middle_block = nn.ModuleList([ResBlock(c, c, use_scale_shift_norm, operations),
                                           SpatialTransformer(c, 2, c // 2, 2, context_dim, operations)])
        self.output_blocks = nn.ModuleList([nn.ModuleList([ResBlock(2 * c, c, use_scale_shift_norm, operations),
                                                           SpatialTransformer(c, 2, c // 2, 1, context_dim, operations)])])
        self.out = nn.Sequential(operations.GroupNorm(8, c), nn.SiLU(), operations.Conv2d(c, 4, 3, padding=1))
        self.scale_shift = nn.Parameter(torch.randn(2, 1, c, 1, 1) * 0.1) if use_scale_shift_norm else None

    def _run(self, blocks, h, context, transformer_options):
        for layer in blocks:
            if isinstance(layer, ResBlock):
                h = layer(h, self.scale_shift)
            elif isinstance(layer, SpatialTransformer):
                h = layer(h, context, transformer_options)
            else:
                h = layer(h)
        return h

    def forward(self, x, timesteps=None, context=None, transformer_options={}, **kwargs):
        transformer_options = dict(transformer_options)
        transformer_options["transformer_index"] = 0
        hs, h = [], x
        for i, blocks in enumerate(self.input_blocks):
            transformer_options["block"] = ("input", i)
            h = self._run(blocks, h, context, transformer_options)
            hs.append(h)
        transformer_options["block"] = ("middle", 0)
        h = self._run(self.middle_block, h, context, transformer_options)
        for i, blocks in enumerate(self.output_blocks):
            transformer_options["block"] = ("output", i)
            h = self._run(blocks, torch.cat([h, hs.pop()], dim=1), context, transformer_options)
        return self.out(h)
