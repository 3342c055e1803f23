"""comfy.ldm.modules.diffusionmodules.openaimodel: ResBlock and a UNetModel reduced to the structure the
rocm_sd node walks (input/middle/output blocks, ResBlocks with GroupNorm+SiLU Sequentials, spatial
transformers, the `out` head), with ComfyUI's transformer_options bookkeeping."""
import math

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


# ---- ComfyUI's UNetModel as SD1.x / SDXL build it, with its forward's steps in order ------------------------------
# (comfy/ldm/modules/diffusionmodules/openaimodel.py: timestep_embedding, TimestepBlock, TimestepEmbedSequential,
# forward_timestep_embed, Upsample, Downsample, ResBlock, apply_control, UNetModel._forward). The step cache's
# partial call reruns parts of this forward and reproduces the rest: the structure (input block 0 the conv, then per
# level num_res_blocks blocks and a Downsample; output blocks mirrored, each level's last with an Upsample) and the
# calling conventions (layers called one by one, control popped from the end, block patches) are the host's.

def timestep_embedding(timesteps, dim, max_period=10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half)
    args = timesteps[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepBlock(nn.Module):
    """A layer that takes the time embedding as its second argument."""


class EmbResBlock(TimestepBlock):
    """ComfyUI's ResBlock: in_layers (GroupNorm, SiLU, conv), emb_layers (SiLU, Linear), out_layers."""

    def __init__(self, channels, emb_channels, out_channels, operations=ops.disable_weight_init):
        super().__init__()
        self.in_layers = nn.Sequential(operations.GroupNorm(8, channels), nn.SiLU(),
                                       operations.Conv2d(channels, out_channels, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), operations.Linear(emb_channels, out_channels))
        self.out_layers = nn.Sequential(operations.GroupNorm(8, out_channels), nn.SiLU(), nn.Dropout(0.0),
                                        operations.Conv2d(out_channels, out_channels, 3, padding=1))
        self.skip_connection = nn.Identity() if channels == out_channels else operations.Conv2d(channels, out_channels, 1)

    def forward(self, x, emb):
        h = self.in_layers(x)
        h = h + self.emb_layers(emb).type(h.dtype)[..., None, None]
        return self.skip_connection(x) + self.out_layers(h)


class Upsample(nn.Module):
    def __init__(self, channels, operations=ops.disable_weight_init):
        super().__init__()
        self.conv = operations.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, output_shape=None):
        size = output_shape[2:4] if output_shape is not None else (x.shape[2] * 2, x.shape[3] * 2)
        return self.conv(torch.nn.functional.interpolate(x, size=size, mode="nearest"))


class Downsample(nn.Module):
    def __init__(self, channels, operations=ops.disable_weight_init):
        super().__init__()
        self.op = operations.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x):
        return self.op(x)


def forward_timestep_embed(ts, x, emb, context=None, transformer_options={}, output_shape=None, time_context=None,
                           num_video_frames=None, image_only_indicator=None):
    for layer in ts:
        if isinstance(layer, TimestepBlock):
            x = layer(x, emb)
        elif isinstance(layer, SpatialTransformer):  # its stand-in counts transformer_index itself (depth 1 here)
            x = layer(x, context, transformer_options)
        elif isinstance(layer, Upsample):
            x = layer(x, output_shape=output_shape)
        else:
            x = layer(x)
    return x


class TimestepEmbedSequential(nn.Sequential, TimestepBlock):
    def forward(self, *args, **kwargs):
        return forward_timestep_embed(self, *args, **kwargs)


def apply_control(h, control, name):
    if control is not None and name in control and len(control[name]) > 0:
        ctrl = control[name].pop()
        if ctrl is not None:
            h += ctrl
    return h


class LeveledUNetModel(nn.Module):
    """SD1.x-like (attention at every level, `adm_in_channels` None) or SDXL-like (no attention at the outermost
    level, a label embedding of `adm_in_channels`), two levels, `num_res_blocks` blocks per level."""

    def __init__(self, channels=16, context_dim=24, num_res_blocks=2, attention_levels=(0, 1), adm_in_channels=None,
                 operations=ops.disable_weight_init):
        super().__init__()
        self.model_channels, self.dtype, self.predict_codebook_ids = channels, torch.float32, False
        self.num_classes = "sequential" if adm_in_channels else None
        emb = 4 * channels
        self.time_embed = nn.Sequential(operations.Linear(channels, emb), nn.SiLU(), operations.Linear(emb, emb))
        if adm_in_channels:
            self.label_emb = nn.Sequential(nn.Sequential(operations.Linear(adm_in_channels, emb), nn.SiLU(),
                                                         operations.Linear(emb, emb)))
        mult = (1, 2)

        def layers(level, ch_in, ch_out):
            out = [EmbResBlock(ch_in, emb, ch_out, operations)]
            if level in attention_levels:
                out.append(SpatialTransformer(ch_out, 2, ch_out // 2, 1, context_dim, operations))
            return out

        self.input_blocks = nn.ModuleList([TimestepEmbedSequential(operations.Conv2d(4, channels, 3, padding=1))])
        chans, ch = [channels], channels
        for level, m in enumerate(mult):
            for _ in range(num_res_blocks):
                self.input_blocks.append(TimestepEmbedSequential(*layers(level, ch, channels * m)))
                ch = channels * m
                chans.append(ch)
            if level != len(mult) - 1:
                self.input_blocks.append(TimestepEmbedSequential(Downsample(ch, operations)))
                chans.append(ch)
        self.middle_block = TimestepEmbedSequential(EmbResBlock(ch, emb, ch, operations),
                                                    SpatialTransformer(ch, 2, ch // 2, 1, context_dim, operations),
                                                    EmbResBlock(ch, emb, ch, operations))
        self.output_blocks = nn.ModuleList()
        for level, m in list(enumerate(mult))[::-1]:
            for i in range(num_res_blocks + 1):
                block = layers(level, ch + chans.pop(), channels * m)
                ch = channels * m
                if level and i == num_res_blocks:
                    block.append(Upsample(ch, operations))
                self.output_blocks.append(TimestepEmbedSequential(*block))
        self.out = nn.Sequential(operations.GroupNorm(8, ch), nn.SiLU(), operations.Conv2d(ch, 4, 3, padding=1))

    def forward(self, x, timesteps=None, context=None, y=None, control=None, transformer_options={}, **kwargs):
        transformer_options["original_shape"] = list(x.shape)
        transformer_options["transformer_index"] = 0
        patches = transformer_options.get("patches", {})
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels).to(self.dtype))
        if self.num_classes is not None:
            emb = emb + self.label_emb(y)
        hs, h = [], x.type(self.dtype)
        for index, module in enumerate(self.input_blocks):
            transformer_options["block"] = ("input", index)
            h = forward_timestep_embed(module, h, emb, context, transformer_options)
            h = apply_control(h, control, "input")
            for patch in patches.get("input_block_patch", []):
                h = patch(h, transformer_options)
            hs.append(h)
            for patch in patches.get("input_block_patch_after_skip", []):
                h = patch(h, transformer_options)
        transformer_options["block"] = ("middle", 0)
        h = forward_timestep_embed(self.middle_block, h, emb, context, transformer_options)
        h = apply_control(h, control, "middle")
        for index, module in enumerate(self.output_blocks):
            transformer_options["block"] = ("output", index)
            hsp = apply_control(hs.pop(), control, "output")
            for patch in patches.get("output_block_patch", []):
                h, hsp = patch(h, hsp, transformer_options)
            h = torch.cat([h, hsp], dim=1)
            h = forward_timestep_embed(module, h, emb, context, transformer_options, hs[-1].shape if hs else None)
        return self.out(h.type(x.dtype))
