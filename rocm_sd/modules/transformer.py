"""BasicTransformerBlock with its residual adds folded into the LayerNorm that follows them.

diffusers' forward for SD's blocks (norm_type "layer_norm", no positional embedding, no feed-forward
chunking), after the LayerNorm patch:
    h = attn1(norm1(h)) + h;  h = attn2(norm2(h), context) + h;  h = ff(norm3(h)) + h
Fused: "attn1(...) + h" with norm2, and "attn2(...) + h" with norm3, are each one rocm_sd::add_layer_norm
(ONNX Runtime's SkipLayerNorm): the add's output is normalised while still in registers, so each pair
reads two tensors and writes two instead of reading three and writing two. Same math, same rounding
(the sum is rounded to the activation dtype before the norm, as torch's add does).

Calls the fused forward does not cover (cross_attention_kwargs such as GLIGEN or IP-Adapter masks, 4-D hidden
states) run diffusers' own forward.
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops.layer_norm import add_layer_norm
from ..ops.quantized_outputs import add_layer_norm_quantize_rows
from .fusing import called_plainly
from .layer_norm import RocmLayerNorm
from .quantized_linear import one_scale, remember_rows


def fusable(block: nn.Module) -> bool:
    return (block.norm_type == "layer_norm" and block.pos_embed is None and block._chunk_size is None
            and block.attn2 is not None and isinstance(block.norm1, RocmLayerNorm)
            and isinstance(block.norm2, RocmLayerNorm) and isinstance(block.norm3, RocmLayerNorm))


def _add_norm(norm: RocmLayerNorm, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, norm(x + residual)), in one kernel where the shapes allow."""
    if x.shape != residual.shape:  # a broadcasting add: leave it to torch
        total = x + residual
        return total, norm(total)
    if norm.quantized_output is None:
        return add_layer_norm.call(x, residual, norm.weight, norm.bias, norm.eps)
    total, y, q, scale = add_layer_norm_quantize_rows.call(x, residual, norm.weight, norm.bias, norm.eps,
                                                           norm.quantized_output, norm.quantized_bound)
    remember_rows(y, norm.quantized_output, q, one_scale(scale, norm.quantized_bound), trusted=True)
    return total, y


def transformer_block_forward(self, hidden_states: torch.Tensor, attention_mask=None, encoder_hidden_states=None,
                  encoder_attention_mask=None, timestep=None, cross_attention_kwargs=None, class_labels=None,
                  added_cond_kwargs=None) -> torch.Tensor:
    if (cross_attention_kwargs or hidden_states.dim() != 3
            or not (called_plainly(self.norm2) and called_plainly(self.norm3))):  # the fused adds read their weights
        return type(self).forward(self, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask,
                                  timestep, cross_attention_kwargs, class_labels, added_cond_kwargs)
    attn_output = self.attn1(self.norm1(hidden_states),
                             encoder_hidden_states=encoder_hidden_states if self.only_cross_attention else None,
                             attention_mask=attention_mask)
    hidden_states, norm_hidden_states = _add_norm(self.norm2, attn_output, hidden_states)
    attn_output = self.attn2(norm_hidden_states, encoder_hidden_states=encoder_hidden_states,
                             attention_mask=encoder_attention_mask)
    hidden_states, norm_hidden_states = _add_norm(self.norm3, attn_output, hidden_states)
    return self.ff(norm_hidden_states) + hidden_states


# Transformer2DModel's output path ends with `.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous()`: the permuted
# view of the token tensor already *is* a channels_last image, and `.contiguous()` turns it into NCHW with a strided
# copy, which the next channels_last op converts back. This replacement of its _get_output_for_continuous_inputs
# skips the copy when the block's input (the residual) is channels_last; values are identical.
def transformer_output_keeping_channels_last(self, hidden_states, residual, batch_size, height, width, inner_dim):
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
