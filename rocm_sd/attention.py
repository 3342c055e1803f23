"""rocm_sd's attention entry point for host apps: q, k, v as [B, H, L, D] (strided views welcome).

Host shims (ComfyUI's attention override, the A1111 optimization, RocmAttnProcessor) call this one
function. Without a mask it goes to the rocm_sd::attention op (rocm_sd/ops/attention.py), which runs
rocm_sd's flash-attention kernel where the tuning database measured it faster and PyTorch's
scaled_dot_product_attention elsewhere; host apps hand q, k, v over as per-head views of [B, L, H*D]
projections, which the op takes without copies. Masked calls go to SDPA directly, and so does every call
on a device where the kernel cannot be chosen for any shape (untuned: the common case) unless something
watches the op (the tuner's harvest, torch.compile, autograd, the profiler): that saves the op's host cost
in eager hosts. The ROCm chunking of large head dims still goes through the op.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import dispatch, ops
from .ops._common import dispatcher_needed
from .ops.attention import OP, default_scale, default_score_budget, kernel_may_run


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v over [B, H, L, D]; mask broadcastable to [B, H, Lq, Lk] (bool: keep)."""
    if mask is not None or q.dim() != 4:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=scale)
    # The shortcut is taken only where nobody watches the op: the tuner's harvest must record every shape.
    chunked = default_score_budget(q.shape[-1], q.device.type, torch.version.hip is not None) is not None
    if not chunked and not kernel_may_run(q.device) and not dispatcher_needed():
        dispatch.count(OP, dispatch.TORCH)  # what the op would have run and counted
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False, scale=scale)
    scale = scale if scale is not None else default_scale(q)
    return ops.attention.call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale).transpose(1, 2)


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
    return attention(q, k, v).transpose(2, 3).reshape(shape)
