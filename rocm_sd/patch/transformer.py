"""BasicTransformerBlock with its residual adds folded into the LayerNorm that follows them.

diffusers' forward for SD's blocks (norm_type "layer_norm", no positional embedding, no feed-forward
chunking), after the LayerNorm patch:
    h = attn1(norm1(h)) + h;  h = attn2(norm2(h), context) + h;  h = ff(norm3(h)) + h
Fused: "attn1(...) + h" with norm2, and "attn2(...) + h" with norm3, are each one rocm_sd::add_layer_norm
(ONNX Runtime's SkipLayerNorm): the add's output is normalised while still in registers, so each pair
reads two tensors and writes two instead of reading three and writing two. Same math, same rounding
(the sum is rounded to the activation dtype before the norm, as torch's add does).

Calls the fused forward does not cover (cross_attention_kwargs such as GLIGEN or IP-Adapter masks,
autograd, 4-D hidden states) run diffusers' own forward.
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops.layer_norm import add_layer_norm
from ..modules.hooks import called_plainly
from ..modules.layer_norm import LayerNormFused
from .core import PatchRecord


def fusable(block: nn.Module) -> bool:
    return (block.norm_type == "layer_norm" and block.pos_embed is None and block._chunk_size is None
            and block.attn2 is not None and isinstance(block.norm1, LayerNormFused)
            and isinstance(block.norm2, LayerNormFused) and isinstance(block.norm3, LayerNormFused))


def _add_norm(norm: LayerNormFused, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, norm(x + residual)), in one kernel where the shapes allow."""
    if x.shape != residual.shape:  # a broadcasting add: leave it to torch
        total = x + residual
        return total, norm(total)
    return add_layer_norm.call(x, residual, norm.weight, norm.bias, norm.eps)


def fused_forward(self, hidden_states: torch.Tensor, attention_mask=None, encoder_hidden_states=None,
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


def patch_transformer_blocks(model: nn.Module, record: PatchRecord) -> None:
    from diffusers.models.attention import BasicTransformerBlock

    for block in model.modules():
        if type(block) is BasicTransformerBlock and fusable(block):
            record.replace_forward(block, fused_forward, "transformer block fused")
