"""comfy.ldm.modules.attention: the attention functions, the per-model override, CrossAttention and
BasicTransformerBlock, as in ComfyUI (the override and the attn1/attn2 replace patches both reach here)."""
import functools

import torch
import torch.nn.functional as F
from torch import nn

from comfy import ops


def wrap_attn(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        remove = False
        try:
            if "_inside_attn_wrapper" not in kwargs:
                transformer_options = kwargs.get("transformer_options", None)
                remove = True
                kwargs["_inside_attn_wrapper"] = True
                if transformer_options is not None and "optimized_attention_override" in transformer_options:
                    return transformer_options["optimized_attention_override"](func, *args, **kwargs)
            return func(*args, **kwargs)
        finally:
            if remove:
                del kwargs["_inside_attn_wrapper"]
    return wrapper


@wrap_attn
def attention_pytorch(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                      **kwargs):
    if skip_reshape:
        b, _, _, dim_head = q.shape
    else:
        b, _, dim_head = q.shape
        dim_head //= heads
        q, k, v = map(lambda t: t.view(b, -1, heads, dim_head).transpose(1, 2), (q, k, v))
    if mask is not None:
        if mask.ndim == 2:
            mask = mask.unsqueeze(0)
        if mask.ndim == 3:
            mask = mask.unsqueeze(1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
    if not skip_output_reshape:
        out = out.transpose(1, 2).reshape(b, -1, heads * dim_head)
    return out


optimized_attention = attention_pytorch
optimized_attention_masked = attention_pytorch


class CrossAttention(nn.Module):
    def __init__(self, query_dim, context_dim=None, heads=8, dim_head=64, operations=ops.disable_weight_init):
        super().__init__()
        inner = heads * dim_head
        context_dim = context_dim or query_dim
        self.heads, self.dim_head, self.attn_precision = heads, dim_head, None
        self.to_q = operations.Linear(query_dim, inner, bias=False)
        self.to_k = operations.Linear(context_dim, inner, bias=False)
        self.to_v = operations.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(operations.Linear(inner, query_dim), nn.Dropout(0.0))

    def forward(self, x, context=None, value=None, mask=None, transformer_options={}):
        q = self.to_q(x)
        context = x if context is None else context
        k, v = self.to_k(context), self.to_v(context if value is None else value)
        attention = optimized_attention if mask is None else optimized_attention_masked
        out = attention(q, k, v, self.heads, mask, attn_precision=self.attn_precision,
                        transformer_options=transformer_options)
        return self.to_out(out)


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out, operations=ops.disable_weight_init):
        super().__init__()
        self.proj = operations.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class FeedForward(nn.Module):
    """ComfyUI's FeedForward (gated): its layers in `net`."""

    def __init__(self, dim, operations=ops.disable_weight_init):
        super().__init__()
        self.net = nn.Sequential(GEGLU(dim, dim * 4, operations), nn.Dropout(0.0), operations.Linear(dim * 4, dim))

    def forward(self, x):
        return self.net(x)


class BasicTransformerBlock(nn.Module):
    """Self-attention, cross-attention, feed-forward; attn1/attn2 replace patches as ComfyUI applies them. As in
    ComfyUI, `ff_in` is False and `disable_self_attn` False for Stable Diffusion's blocks."""

    def __init__(self, dim, n_heads, d_head, context_dim, operations=ops.disable_weight_init):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head
        self.ff_in, self.disable_self_attn = False, False
        self.attn1 = CrossAttention(dim, None, n_heads, d_head, operations)
        self.attn2 = CrossAttention(dim, context_dim, n_heads, d_head, operations)
        self.ff = FeedForward(dim, operations)
        self.norm1, self.norm2, self.norm3 = (operations.LayerNorm(dim) for _ in range(3))

    def _attend(self, attn, name, n, context, transformer_options):
        block = transformer_options.get("block")
        replace = transformer_options.get("patches_replace", {}).get(name, {})
        key = None
        if block is not None:  # (block name, number, index in its spatial transformer), else (name, number)
            key = (block[0], block[1], transformer_options.get("block_index", 0))
            key = key if key in replace else block if block in replace else None
        if key is None:
            return attn(n, context=context, transformer_options=transformer_options)
        context = n if context is None else context
        extra = dict(transformer_options, n_heads=self.n_heads, dim_head=self.d_head, attn_precision=None)
        return attn.to_out(replace[key](attn.to_q(n), attn.to_k(context), attn.to_v(context), extra))

    def forward(self, x, context=None, transformer_options={}):
        x = self._attend(self.attn1, "attn1", self.norm1(x), None, transformer_options) + x
        x = self._attend(self.attn2, "attn2", self.norm2(x), context, transformer_options) + x
        return self.ff(self.norm3(x)) + x
