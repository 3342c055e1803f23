"""BasicTransformerBlock with its residual adds folded into the LayerNorm that follows them.

diffusers' forward for SD's blocks (norm_type "layer_norm", no positional embedding, no feed-forward
chunking), after the LayerNorm patch:
    h = attn1(norm1(h)) + h;  h = attn2(norm2(h), context) + h;  h = ff(norm3(h)) + h
Fused: "attn1(...) + h" with norm2, and "attn2(...) + h" with norm3, are each one rocm_sd::add_layer_norm
(ONNX Runtime's SkipLayerNorm): the add's output is normalised while still in registers, so each pair
reads two tensors and writes two instead of reading three and writing two. Same math, same rounding
(the sum is rounded to the activation dtype before the norm, as torch's add does).

With optimize(precision="fp8"/"int8") a norm whose every consumer is an 8-bit layer of its format (the attention's
projections through RocmAttnProcessor, the GEGLU's projection) writes only its quantized rows, not its output: the
consumers find them on a stand-in (quantized_linear.rows_stand_in). Anything else taking the output (another
processor, hooks, a layer gone back to fp16, torch.compile) gets the written output, as before.

Calls the fused forward does not cover (cross_attention_kwargs such as GLIGEN or IP-Adapter masks, 4-D hidden
states) run diffusers' own forward.
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops.layer_norm import add_layer_norm
from ..ops.quantized_outputs import add_layer_norm_quantize_rows, add_layer_norm_quantized
from .attention import RocmAttnProcessor
from .fusing import called_plainly
from .geglu import RocmGEGLU
from .layer_norm import RocmLayerNorm
from .quantized_linear import RocmQuantizedLinear, one_scale, remember_rows, rows_stand_in


def fusable(block: nn.Module) -> bool:
    return (block.norm_type == "layer_norm" and block.pos_embed is None and block._chunk_size is None
            and block.attn2 is not None and isinstance(block.norm1, RocmLayerNorm)
            and isinstance(block.norm2, RocmLayerNorm) and isinstance(block.norm3, RocmLayerNorm))


def _attention_input_layers(attn: nn.Module, cross: bool) -> list[nn.Module] | None:
    """The layers RocmAttnProcessor applies to an attention module's hidden_states (with `cross`, the keys and values
    come from the text instead); None where something else may read hidden_states: another processor, hooks, a norm or
    residual of the input."""
    if not (type(attn.processor) is RocmAttnProcessor and called_plainly(attn) and attn.spatial_norm is None
            and attn.group_norm is None and not attn.residual_connection):
        return None
    if getattr(attn, "fused_projections", False):
        return [attn.to_q] if cross else [attn.to_qkv]
    return [attn.to_q] if cross else [attn.to_q, attn.to_k, attn.to_v]


def _feed_forward_input_layers(ff: nn.Module) -> list[nn.Module] | None:
    """The layer a diffusers FeedForward (GEGLU first) applies to its input: the GEGLU's projection."""
    net = getattr(ff, "net", None)
    if net is None or not len(net) or not isinstance(net[0], RocmGEGLU) or not (called_plainly(ff)
                                                                             and called_plainly(net[0])):
        return None
    return [net[0].proj]


def _rows_only(norm: RocmLayerNorm, consumers: list[nn.Module] | None) -> bool:
    """Whether every consumer of the norm's output multiplies the norm's quantized rows for good: then the norm need not
    write its output."""
    fmt = norm.quantized_output
    return (fmt is not None and consumers is not None and not torch.compiler.is_compiling() and all(
        isinstance(m, RocmQuantizedLinear) and not m.conv and m.runs_8bit and m.format == fmt and called_plainly(m)
        for m in consumers))


def _norm(norm: RocmLayerNorm, x: torch.Tensor, consumers: list[nn.Module] | None) -> torch.Tensor:
    return norm.rows_only(x) if _rows_only(norm, consumers) and called_plainly(norm) else norm(x)


def _add_norm(norm: RocmLayerNorm, x: torch.Tensor, residual: torch.Tensor,
              consumers: list[nn.Module] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, norm(x + residual)), in one kernel where the shapes allow; the norm's output as its quantized
    rows' stand-in where `consumers` take only those."""
    if x.shape != residual.shape:  # a broadcasting add: leave it to torch
        total = x + residual
        return total, norm(total)
    fmt = norm.quantized_output
    if fmt is None:
        return add_layer_norm.call(x, residual, norm.weight, norm.bias, norm.eps)
    if _rows_only(norm, consumers):
        total, q, scale = add_layer_norm_quantized.call(x, residual, norm.weight, norm.bias, norm.eps, fmt,
                                                        norm.quantized_bound)
        return total, rows_stand_in(total.shape, total.dtype, fmt, q, one_scale(scale, norm.quantized_bound))
    total, y, q, scale = add_layer_norm_quantize_rows.call(x, residual, norm.weight, norm.bias, norm.eps, fmt,
                                                           norm.quantized_bound)
    remember_rows(y, fmt, q, one_scale(scale, norm.quantized_bound), trusted=True)
    return total, y


def transformer_block_forward(self, hidden_states: torch.Tensor, attention_mask=None, encoder_hidden_states=None,
                  encoder_attention_mask=None, timestep=None, cross_attention_kwargs=None, class_labels=None,
                  added_cond_kwargs=None) -> torch.Tensor:
    if (cross_attention_kwargs or hidden_states.dim() != 3
            or not (called_plainly(self.norm2) and called_plainly(self.norm3))):  # the fused adds read their weights
        return type(self).forward(self, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask,
                                  timestep, cross_attention_kwargs, class_labels, added_cond_kwargs)
    context1 = encoder_hidden_states if self.only_cross_attention else None
    attn_output = self.attn1(_norm(self.norm1, hidden_states, _attention_input_layers(self.attn1, context1 is not None)),
                             encoder_hidden_states=context1, attention_mask=attention_mask)
    hidden_states, norm_hidden_states = _add_norm(self.norm2, attn_output, hidden_states,
                                                  _attention_input_layers(self.attn2, encoder_hidden_states is not None))
    attn_output = self.attn2(norm_hidden_states, encoder_hidden_states=encoder_hidden_states,
                             attention_mask=encoder_attention_mask)
    hidden_states, norm_hidden_states = _add_norm(self.norm3, attn_output, hidden_states,
                                                  _feed_forward_input_layers(self.ff))
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
