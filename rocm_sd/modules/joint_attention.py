"""Joint attention of the diffusion transformers: RocmJointAttnProcessor (SD3 / SD3.5's JointAttnProcessor2_0 and
its fused-QKV variant) and RocmFluxAttnProcessor (Flux's FluxAttnProcessor), step for step as diffusers, with

- the RMSNorm of Q and K per head, the joining of the image and text streams' rows, and Flux's rotary embedding as
  one rocm_sd::rms_norm per Q and per K, written as the [B, L, H, D] layout the attention reads (diffusers: two
  norms, a concatenation, and for Flux a rotary pass of six elementwise kernels, per Q and per K); V written
  into the joint sequence by the projections themselves (modules/joint_rows.py);
- the attention through rocm_sd::attention on [B, L, H, D] views (ops/attention.py decides between its kernel and
  SDPA per shape).

Calls these do not cover (an attention mask, IP-Adapter or other extra arguments, rotary embeddings in another
form, Q/K norms of other kinds) go to the processor they replaced.
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops.attention import scaled_dot_product_attention
from ..ops.rms_norm import rms_norm
from .attention import heads_last
from .joint_rows import joined, joint_linear, joint_qkv, linear_rows


def _rms_parameters(norm) -> tuple[torch.Tensor | None, float] | None:
    """(weight, eps) of an RMSNorm over the head dim as rocm_sd::rms_norm computes it (torch.nn.RMSNorm, diffusers'
    RMSNorm without a bias), else None."""
    if type(norm) is nn.RMSNorm and len(norm.normalized_shape) == 1:
        return norm.weight, norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
    if type(norm).__name__ == "RMSNorm" and type(norm).__module__ == "diffusers.models.normalization" \
            and getattr(norm, "bias", None) is None:
        return norm.weight, norm.eps
    return None


def _joined_normed(x, norm, lead=None, lead_norm=None, rotary=None) -> torch.Tensor:
    """cat([lead_norm(lead), norm(x)], dim=1), rotated by `rotary` (cos, sin), as one rocm_sd::rms_norm where both
    norms are RMSNorms (or both absent: then only the join and the rotation remain, done by PyTorch)."""
    params, lead_params = _rms_parameters(norm), _rms_parameters(lead_norm) if lead is not None else None
    cos, sin = rotary if rotary is not None else (None, None)
    if params is not None and (lead is None or lead_params is not None and lead_params[1] == params[1]):
        return rms_norm.call(x, params[0], params[1], lead, lead_params[0] if lead_params else None, cos, sin)
    x = norm(x) if norm is not None else x
    if lead is not None:
        x = torch.cat([lead_norm(lead) if lead_norm is not None else lead, x], dim=1)
    if rotary is not None:
        from diffusers.models.embeddings import apply_rotary_emb

        x = apply_rotary_emb(x, rotary, sequence_dim=1)
    return x


def _projections(attn, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """to_q, to_k and to_v of hidden_states (fuse_qkv: views of to_qkv's)."""
    if getattr(attn, "fused_projections", False):
        return attn.to_qkv(hidden_states).chunk(3, dim=-1)
    return attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)


def _context_projections(attn, encoder_hidden_states: torch.Tensor):
    if getattr(attn, "fused_projections", False) and hasattr(attn, "to_added_qkv"):
        return attn.to_added_qkv(encoder_hidden_states).chunk(3, dim=-1)
    return (attn.add_q_proj(encoder_hidden_states), attn.add_k_proj(encoder_hidden_states),
            attn.add_v_proj(encoder_hidden_states))


def _joint_projections(attn, first: torch.Tensor, second: torch.Tensor, head_dim: int, text_first: bool = False):
    """((Q of first, Q of second), (K ..., K ...), V joined), each [B, L, H, D]: `first` is the stream whose rows
    lead the joint sequence (SD3's image, Flux's text). V, or with fuse_qkv all three, is written by the two streams'
    projections into one joint tensor (joint_rows.joint_linear / joint_qkv), so nothing concatenates it; Q and K stay
    the streams' own, which the Q / K norm joins."""
    image, text = (second, first) if text_first else (first, second)
    fused = getattr(attn, "fused_projections", False)
    if fused and hasattr(attn, "to_added_qkv"):
        layers = (attn.to_added_qkv, attn.to_qkv) if text_first else (attn.to_qkv, attn.to_added_qkv)
        queries, keys, value = joint_qkv(layers[0], first, layers[1], second)
        return (tuple(_heads(t, head_dim) for t in queries), tuple(_heads(t, head_dim) for t in keys),
                _heads(value, head_dim))
    if fused:  # fused image projections only: V of the two kinds joined by copies
        i_query, i_key, i_value = _projections(attn, image)
        c_query, c_key, c_value = _context_projections(attn, text)
        i_query, i_key, i_value, c_query, c_key, c_value = (
            _heads(t, head_dim) for t in (i_query, i_key, i_value, c_query, c_key, c_value))
        value = joined(c_value, i_value) if text_first else joined(i_value, c_value)
    else:
        i_query, i_key = _heads(attn.to_q(image), head_dim), _heads(attn.to_k(image), head_dim)
        c_query, c_key = _heads(attn.add_q_proj(text), head_dim), _heads(attn.add_k_proj(text), head_dim)
        v_layers = (attn.add_v_proj, attn.to_v) if text_first else (attn.to_v, attn.add_v_proj)
        value = _heads(joint_linear(v_layers[0], first, v_layers[1], second), head_dim)
    if text_first:
        return (c_query, i_query), (c_key, i_key), value
    return (i_query, c_query), (i_key, c_key), value


def _rotary_pair(rotary) -> bool:
    return (isinstance(rotary, tuple) and len(rotary) == 2
            and all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in rotary))


def _heads(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    return t.unflatten(-1, (-1, head_dim))


def attend(query, key, value) -> torch.Tensor:
    """Attention over [B, L, H, D] (views welcome); (B, L, H * D) out."""
    return heads_last(scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2),
                                                   value.transpose(1, 2))).to(query.dtype)


class RocmJointAttnProcessor:
    """SD3's JointAttnProcessor2_0: [image, text] rows joined, Q/K RMSNorm (SD3.5) fused with the join."""

    def __init__(self, fallback):
        self.fallback = fallback  # the processor this one replaced: gets the calls it does not take
        # Attention over the joined rows: sequence parallelism (parallel/seq.py) puts its all-to-all around it.
        self.attend = attend

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, *args, **kwargs):
        if attention_mask is not None or args or kwargs or hidden_states.dim() != 3:
            return self.fallback(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)
        head_dim = attn.inner_dim // attn.heads
        if encoder_hidden_states is None:
            query, key, value = (_heads(t, head_dim) for t in _projections(attn, hidden_states))
            query = _joined_normed(query, attn.norm_q)
            key = _joined_normed(key, attn.norm_k)
        else:
            # SD3 puts the image rows first: they are the op's leading rows, the text its own
            (query, c_query), (key, c_key), value = _joint_projections(attn, hidden_states, encoder_hidden_states,
                                                                        head_dim)
            query = _joined_normed(c_query, attn.norm_added_q, query, attn.norm_q)
            key = _joined_normed(c_key, attn.norm_added_k, key, attn.norm_k)

        hidden = self.attend(query, key, value)
        if encoder_hidden_states is None:
            return attn.to_out[1](attn.to_out[0](hidden))
        length = hidden_states.shape[1]
        hidden, context_out = hidden[:, :length], hidden[:, length:]
        if not attn.context_pre_only:
            context_out = linear_rows(attn.to_add_out, context_out)
        return attn.to_out[1](linear_rows(attn.to_out[0], hidden)), context_out


class RocmFluxAttnProcessor:
    """Flux's FluxAttnProcessor: [text, image] rows joined, Q/K RMSNorm and the rotary embedding fused with the join."""

    def __init__(self, fallback):
        self.fallback = fallback
        self.attend = attend

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, image_rotary_emb=None, **kwargs):
        if attention_mask is not None or kwargs or (image_rotary_emb is not None and not _rotary_pair(image_rotary_emb)):
            return self.fallback(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb,
                                 **kwargs)
        joint = encoder_hidden_states is not None and attn.added_kv_proj_dim is not None
        if joint:
            # Flux puts the text rows first
            (c_query, query), (c_key, key), value = _joint_projections(attn, encoder_hidden_states, hidden_states,
                                                                        attn.head_dim, text_first=True)
            query = _joined_normed(query, attn.norm_q, c_query, attn.norm_added_q, image_rotary_emb)
            key = _joined_normed(key, attn.norm_k, c_key, attn.norm_added_k, image_rotary_emb)
        else:
            query, key, value = (_heads(t, attn.head_dim) for t in _projections(attn, hidden_states))
            query = _joined_normed(query, attn.norm_q, rotary=image_rotary_emb)
            key = _joined_normed(key, attn.norm_k, rotary=image_rotary_emb)

        hidden = self.attend(query, key, value)
        if not joint:
            return hidden
        text_length = encoder_hidden_states.shape[1]
        context_out, hidden = hidden[:, :text_length], hidden[:, text_length:]
        hidden = attn.to_out[1](linear_rows(attn.to_out[0], hidden))
        return hidden, linear_rows(attn.to_add_out, context_out)
