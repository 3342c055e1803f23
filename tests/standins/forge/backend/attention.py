"""backend/attention.py as at dfdcbab6, its PyTorch path: attention_function is attention_pytorch where Forge finds
PyTorch's SDPA usable (the other choices, xformers / split / sub-quadratic, compute the same)."""
import torch


def attention_pytorch(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False):
    if skip_reshape:
        b, _, _, dim_head = q.shape
    else:
        b, _, dim_head = q.shape
        dim_head //= heads
        q, k, v = (t.view(b, -1, heads, dim_head).transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
    return out.transpose(1, 2).reshape(b, -1, heads * dim_head)


attention_function = attention_pytorch
