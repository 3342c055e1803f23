"""rocm_sd's attention entry point for host apps: q, k, v as [B, H, L, D] (strided views welcome).

Today it is PyTorch's scaled_dot_product_attention (flash / memory-efficient / math as torch picks, on
ROCm AOTriton's kernels): rocm_sd has no attention kernel of its own yet (the flash-attention issue).
Host shims (ComfyUI's attention override, the A1111 optimization) call this one function, so the kernel
and the tuner's per-shape choice land in every host at once when they exist.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v over [B, H, L, D]; mask broadcastable to [B, H, Lq, Lk] (bool: keep)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=scale)


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
    return attention(q, k, v).transpose(2, 3).reshape(shape)
