"""Keeps channels_last activations channels_last through diffusers' Transformer2DModel.

Its output path ends the transformer with `.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous()`:
the permuted view of the token tensor already *is* a channels_last image, and `.contiguous()` turns
it into NCHW with a strided copy, which the next channels_last op converts back (the single largest
elementwise cost in the profile of a channels_last SD1.5 step, bench/notes/sd15.md). The patched
method skips the copy when the block's input (the residual) is channels_last; values are identical.
"""
from __future__ import annotations

import torch
from torch import nn

from .core import PatchRecord


def _output_keeping_channels_last(self, hidden_states, residual, batch_size, height, width, inner_dim):
    if not residual.is_contiguous(memory_format=torch.channels_last) or residual.is_contiguous():
        return type(self)._get_output_for_continuous_inputs(self, hidden_states, residual, batch_size, height,
                                                            width, inner_dim)
    if not self.use_linear_projection:
        hidden_states = hidden_states.reshape(batch_size, height, width, inner_dim).permute(0, 3, 1, 2)
        hidden_states = self.proj_out(hidden_states)
    else:
        hidden_states = self.proj_out(hidden_states)
        hidden_states = hidden_states.reshape(batch_size, height, width, inner_dim).permute(0, 3, 1, 2)
    return hidden_states + residual


def patch_transformer_layouts(model: nn.Module, record: PatchRecord) -> None:
    for module in model.modules():
        if type(module).__name__ == "Transformer2DModel" and hasattr(module, "_get_output_for_continuous_inputs"):
            record.bind(module, "_get_output_for_continuous_inputs", _output_keeping_channels_last)
            record.counts["transformer output kept channels_last"] += 1
