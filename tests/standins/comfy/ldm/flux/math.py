"""comfy.ldm.flux.math as at a125cd84: Flux's attention (rope applied to q and k, then optimized_attention on
(B, H, L, D)) and its rope tables ((B, 1, L, D/2, 2, 2) rotation matrices)."""
import torch

from comfy.ldm.modules.attention import optimized_attention


def attention(q, k, v, pe, mask=None, transformer_options={}):
    q_shape, k_shape = q.shape, k.shape
    if pe is not None:
        q = q.to(dtype=pe.dtype).reshape(*q.shape[:-1], -1, 1, 2)
        k = k.to(dtype=pe.dtype).reshape(*k.shape[:-1], -1, 1, 2)
        q = (pe[..., 0] * q[..., 0] + pe[..., 1] * q[..., 1]).reshape(*q_shape).type_as(v)
        k = (pe[..., 0] * k[..., 0] + pe[..., 1] * k[..., 1]).reshape(*k_shape).type_as(v)
    heads = q.shape[1]
    return optimized_attention(q, k, v, heads, skip_reshape=True, mask=mask, transformer_options=transformer_options)


def rope(pos, dim: int, theta: int):
    assert dim % 2 == 0
    scale = torch.linspace(0, (dim - 2) / dim, steps=dim // 2, dtype=torch.float64, device=pos.device)
    omega = 1.0 / (theta ** scale)
    out = torch.einsum("...n,d->...nd", pos.to(dtype=torch.float32), omega)
    out = torch.stack([torch.cos(out), -torch.sin(out), torch.sin(out), torch.cos(out)], dim=-1)
    return out.reshape(*out.shape[:-1], 2, 2).to(dtype=torch.float32)
