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
from .quantized_linear import one_scale, remember_rows, rows_stand_in, takes_rows_for_good


def fusable(block: nn.Module) -> bool:
    return (block.norm_type == "layer_norm" and block.pos_embed is None and block._chunk_size is None
            and block.attn2 is not None and isinstance(block.norm1, RocmLayerNorm)
            and isinstance(block.norm2, RocmLayerNorm) and isinstance(block.norm3, RocmLayerNorm))


def _attention_reads_only_its_projections(attn: nn.Module, as_assumed: bool) -> bool:
    """Whether a call of attention module `attn` applies nothing but the norm's consumers to its hidden_states:
    rocm_sd's processor, no hooks, no norm or residual of the input, and (`as_assumed`) the text given or not as
    patch/precision.py's consumers assume (with it, the query alone takes hidden_states)."""
    return (as_assumed and type(attn.processor) is RocmAttnProcessor and called_plainly(attn)
            and attn.spatial_norm is None and attn.group_norm is None and not attn.residual_connection)


def _feed_forward_reads_only_its_projection(ff: nn.Module) -> bool:
    """Whether a diffusers FeedForward applies nothing but its GEGLU's projection to its input."""
    net = getattr(ff, "net", None)
    return net is not None and isinstance(net[0], RocmGEGLU) and called_plainly(ff) and called_plainly(net[0])


def _rows_only(norm: RocmLayerNorm, only_consumers_read: bool) -> bool:
    """Whether the norm need not write its output: its consumers (patch/precision.py found them) are all that read it
    in this call (`only_consumers_read`), and each multiplies the norm's quantized rows for good."""
    fmt, consumers = norm.quantized_output, norm.quantized_consumers
    return (fmt is not None and len(consumers) > 0 and only_consumers_read and called_plainly(norm)
            and not torch.compiler.is_compiling() and takes_rows_for_good(consumers, fmt))


def _norm(norm: RocmLayerNorm, x: torch.Tensor, only_consumers_read: bool) -> torch.Tensor:
    return norm.rows_only(x) if _rows_only(norm, only_consumers_read) else norm(x)


def _add_norm(norm: RocmLayerNorm, x: torch.Tensor, residual: torch.Tensor,
              only_consumers_read: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, norm(x + residual)), in one kernel where the shapes allow; the norm's output as its quantized
    rows' stand-in where only its consumers read it and they take only those (_rows_only)."""
    if x.shape != residual.shape:  # a broadcasting add: leave it to torch
        total = x + residual
        return total, norm(total)
    fmt = norm.quantized_output
    if fmt is None:
        return add_layer_norm.call(x, residual, norm.weight, norm.bias, norm.eps)
    if _rows_only(norm, only_consumers_read):
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
    as_assumed = context1 is not None or not self.only_cross_attention
    self_reads = _attention_reads_only_its_projections(self.attn1, as_assumed)
    attn_output = self.attn1(_norm(self.norm1, hidden_states, self_reads), encoder_hidden_states=context1,
                             attention_mask=attention_mask)
    hidden_states, norm_hidden_states = _add_norm(
        self.norm2, attn_output, hidden_states,
        _attention_reads_only_its_projections(self.attn2, encoder_hidden_states is not None))
    attn_output = self.attn2(norm_hidden_states, encoder_hidden_states=encoder_hidden_states,
                             attention_mask=encoder_attention_mask)
    hidden_states, norm_hidden_states = _add_norm(self.norm3, attn_output, hidden_states,
                                                  _feed_forward_reads_only_its_projection(self.ff))
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
