"""Attention for the host apps: RocmAttnProcessor, diffusers' AttnProcessor2_0 (and FusedAttnProcessor2_0) step
for step, with the attention itself through rocm_sd::attention (ops/attention.py decides, per call, between the
op and SDPA); the per-head views the host shims (ComfyUI, A1111) hand over; the VAE's spatial attention.

Same steps as diffusers: spatial norm, 4-D (VAE) input, attention mask, group norm, cross-attention
norm, fused QKV / KV projections when the module has them, q/k norms, output projection and dropout,
residual connection and rescale factor. A call this processor does not know (extra positional
arguments, the deprecated `scale`) goes to the processor it replaced, unchanged.
"""
from __future__ import annotations

import torch

from ..ops.attention import scaled_dot_product_attention
from ..ops.attention_fp8 import scaled_dot_product_attention_fp8


def heads_first(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, heads * D) -> (B, heads, L, D), a view: how host apps hand over q, k and v."""
    batch, length, inner = t.shape
    return t.view(batch, length, heads, inner // heads).transpose(1, 2)


def heads_last(t: torch.Tensor) -> torch.Tensor:
    """(B, heads, L, D) -> (B, L, heads * D): the attention output as the output projection takes it."""
    batch, heads, length, dim = t.shape
    return t.transpose(1, 2).reshape(batch, length, heads * dim)


def spatial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The VAE's attention block: q, k, v as (B, C, H, W), one head of C channels over the H*W positions."""
    shape = q.shape
    q, k, v = (t.reshape(shape[0], 1, shape[1], -1).transpose(2, 3) for t in (q, k, v))
    if q.stride(-1) != 1:  # NCHW input (channels_last gives free views): one copy each, as the hosts' own VAE
        q, k, v = (t.contiguous() for t in (q, k, v))  # attention does; SDPA and the kernel want unit-stride channels
    return scaled_dot_product_attention(q, k, v).transpose(2, 3).reshape(shape)


def text_projections(attn, text: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What cross-attention module `attn` projects the text to: (to_kv(text),) with fused projections, else
    (to_k(text), to_v(text)), after its norm_cross. modules/text_kv.py keeps these per text."""
    if attn.norm_cross:
        text = attn.norm_encoder_hidden_states(text)
    if getattr(attn, "fused_projections", False):
        return (attn.to_kv(text),)
    return attn.to_k(text), attn.to_v(text)


def keys_values(projections: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(key, value) of text_projections' result."""
    return projections[0].chunk(2, dim=-1) if len(projections) == 1 else projections


class RocmAttnProcessor:
    def __init__(self, fallback):
        self.fallback = fallback  # the processor this one replaced: gets the calls it does not take
        self.fp8_format = None    # set by optimize(attention_precision="fp8"): unmasked calls go to attention_fp8
        self.text_kv = None       # set by optimize(text_kv=True): the text's keys and values once per text

    def _projections(self, attn, hidden_states, encoder_hidden_states):
        if encoder_hidden_states is None:
            if getattr(attn, "fused_projections", False):
                return attn.to_qkv(hidden_states).chunk(3, dim=-1)
            return attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        kept = self.text_kv.keys_values(attn, encoder_hidden_states) if self.text_kv is not None else None
        if kept is None:
            kept = keys_values(text_projections(attn, encoder_hidden_states))
        return (attn.to_q(hidden_states), *kept)

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, temb: torch.Tensor | None = None, *args, **kwargs):
        if args or kwargs:
            return self.fallback(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channel, height * width).transpose(1, 2)
        batch, sequence_length, _ = (hidden_states if encoder_hidden_states is None else encoder_hidden_states).shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query, key, value = self._projections(attn, hidden_states, encoder_hidden_states)
        query, key, value = (heads_first(t, attn.heads) for t in (query, key, value))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        if self.fp8_format is not None and attention_mask is None:
            attended = scaled_dot_product_attention_fp8(query, key, value, self.fp8_format)
        else:
            attended = scaled_dot_product_attention(query, key, value, attention_mask)
        hidden_states = heads_last(attended).to(query.dtype)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        if attn.rescale_output_factor == 1.0:  # diffusers divides by 1.0 too: a full pass over the output for nothing
            return hidden_states
        return hidden_states / attn.rescale_output_factor
