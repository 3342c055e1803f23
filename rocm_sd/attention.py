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
