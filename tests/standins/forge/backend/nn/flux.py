"""backend/nn/flux.py as at dfdcbab6 (its blocks unchanged since 81d8f55b, 2024-08-28): Forge's own port of BFL's
Flux, IntegratedFluxTransformer2DModel with DoubleStreamBlock / SingleStreamBlock / LastLayer, the forwards op for
op as Forge's (einops' rearrange / repeat written out as view / permute / expand). Built, as Forge's loader builds
it (backend/loader.py), inside backend.operations.using_forge_operations: `nn.Linear` / `nn.LayerNorm` are read from
torch.nn when a block is made.

Where it differs from ComfyUI's port (tests/standins/comfy/ldm/flux): forward(img, txt, vec, pe) without mask,
transformer options or modulation_dims; Modulation returns a tuple of (B, 1, C) chunks; txt always first; attention
applies rope (apply_rope) and calls attention_function itself; fp16_fix clamps to +-32768; RMSNorm keeps eps and
casts (and keeps) its scale in the input's dtype."""
import math

import torch
from torch import nn

from backend.attention import attention_function
from backend.utils import fp16_fix, tensor2parameter


def attention(q, k, v, pe):
    q, k = apply_rope(q, k, pe)
    return attention_function(q, k, v, q.shape[1], skip_reshape=True)


def rope(pos, dim, theta):
    scale = torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim
    omega = 1.0 / (theta ** scale)
    out = pos.unsqueeze(-1) * omega.unsqueeze(0)
    out = torch.stack([torch.cos(out), -torch.sin(out), torch.sin(out), torch.cos(out)], dim=-1)
    b, n, d, _ = out.shape
    return out.view(b, n, d, 2, 2).float()


def apply_rope(xq, xk, freqs_cis):
    xq_ = xq.float().reshape(*xq.shape[:-1], -1, 1, 2)
    xk_ = xk.float().reshape(*xk.shape[:-1], -1, 1, 2)
    xq_out = freqs_cis[..., 0] * xq_[..., 0] + freqs_cis[..., 1] * xq_[..., 1]
    xk_out = freqs_cis[..., 0] * xk_[..., 0] + freqs_cis[..., 1] * xk_[..., 1]
    return xq_out.reshape(*xq.shape).type_as(xq), xk_out.reshape(*xk.shape).type_as(xk)


def timestep_embedding(t, dim, max_period=10000, time_factor=1000.0):
    t = time_factor * t
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return embedding.to(t) if torch.is_floating_point(t) else embedding


class EmbedND(nn.Module):
    def __init__(self, dim, theta, axes_dim):
        super().__init__()
        self.dim, self.theta, self.axes_dim = dim, theta, axes_dim

    def forward(self, ids):
        emb = torch.cat([rope(ids[..., i], self.axes_dim[i], self.theta) for i in range(ids.shape[-1])], dim=-3)
        return emb.unsqueeze(1)


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim, hidden_dim):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, hidden_dim, bias=True)
        self.silu = nn.SiLU()
        self.out_layer = nn.Linear(hidden_dim, hidden_dim, bias=True)

    def forward(self, x):
        return self.out_layer(self.silu(self.in_layer(x)))


functional_rms_norm = torch.rms_norm


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = None  # Forge: makes its memory management profile the module
        self.scale = nn.Parameter(torch.ones(dim))
        self.eps = 1e-6
        self.normalized_shape = [dim]

    def forward(self, x):
        if self.scale.dtype != x.dtype:
            self.scale = tensor2parameter(self.scale.to(dtype=x.dtype))
        return functional_rms_norm(x, self.normalized_shape, self.scale, self.eps)


class QKNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)

    def forward(self, q, k, v):
        q, k = self.query_norm(q), self.key_norm(k)
        return q.to(k), k.to(q)


class SelfAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.norm = QKNorm(dim // num_heads)
        self.proj = nn.Linear(dim, dim)


class Modulation(nn.Module):
    def __init__(self, dim, double):
        super().__init__()
        self.is_double = double
        self.multiplier = 6 if double else 3
        self.lin = nn.Linear(dim, self.multiplier * dim, bias=True)

    def forward(self, vec):
        return self.lin(nn.functional.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)


def _split_heads(qkv, heads):
    """(B, L, 3 * H * D) -> q, k, v (B, H, L, D), as Forge's view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)."""
    b, length, width = qkv.shape
    return qkv.view(b, length, 3, heads, width // (3 * heads)).permute(2, 0, 3, 1, 4)


class DoubleStreamBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio, qkv_bias=False):
        super().__init__()
        mlp_hidden_dim = int(hidden_size * mlp_ratio)
        self.num_heads, self.hidden_size = num_heads, hidden_size
        for s in ("img", "txt"):
            setattr(self, f"{s}_mod", Modulation(hidden_size, double=True))
            setattr(self, f"{s}_norm1", nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6))
            setattr(self, f"{s}_attn", SelfAttention(dim=hidden_size, num_heads=num_heads, qkv_bias=qkv_bias))
            setattr(self, f"{s}_norm2", nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6))
            setattr(self, f"{s}_mlp", nn.Sequential(nn.Linear(hidden_size, mlp_hidden_dim, bias=True),
                                                    nn.GELU(approximate="tanh"),
                                                    nn.Linear(mlp_hidden_dim, hidden_size, bias=True)))

    def forward(self, img, txt, vec, pe):
        img_shift1, img_scale1, img_gate1, img_shift2, img_scale2, img_gate2 = self.img_mod(vec)
        img_q, img_k, img_v = _split_heads(self.img_attn.qkv((1 + img_scale1) * self.img_norm1(img) + img_shift1),
                                           self.num_heads)
        img_q, img_k = self.img_attn.norm(img_q, img_k, img_v)
        txt_shift1, txt_scale1, txt_gate1, txt_shift2, txt_scale2, txt_gate2 = self.txt_mod(vec)
        txt_q, txt_k, txt_v = _split_heads(self.txt_attn.qkv((1 + txt_scale1) * self.txt_norm1(txt) + txt_shift1),
                                           self.num_heads)
        txt_q, txt_k = self.txt_attn.norm(txt_q, txt_k, txt_v)

        attn = attention(torch.cat((txt_q, img_q), dim=2), torch.cat((txt_k, img_k), dim=2),
                         torch.cat((txt_v, img_v), dim=2), pe=pe)
        txt_attn, img_attn = attn[:, :txt.shape[1]], attn[:, txt.shape[1]:]

        img = img + img_gate1 * self.img_attn.proj(img_attn)
        img = img + img_gate2 * self.img_mlp((1 + img_scale2) * self.img_norm2(img) + img_shift2)
        txt = txt + txt_gate1 * self.txt_attn.proj(txt_attn)
        txt = txt + txt_gate2 * self.txt_mlp((1 + txt_scale2) * self.txt_norm2(txt) + txt_shift2)
        return img, fp16_fix(txt)


class SingleStreamBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0, qk_scale=None):
        super().__init__()
        self.hidden_dim, self.num_heads = hidden_size, num_heads
        head_dim = hidden_size // num_heads
        self.scale = qk_scale or head_dim ** -0.5
        self.mlp_hidden_dim = int(hidden_size * mlp_ratio)
        self.linear1 = nn.Linear(hidden_size, hidden_size * 3 + self.mlp_hidden_dim)
        self.linear2 = nn.Linear(hidden_size + self.mlp_hidden_dim, hidden_size)
        self.norm = QKNorm(head_dim)
        self.hidden_size = hidden_size
        self.pre_norm = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp_act = nn.GELU(approximate="tanh")
        self.modulation = Modulation(hidden_size, double=False)

    def forward(self, x, vec, pe):
        shift, scale, gate = self.modulation(vec)
        qkv, mlp = torch.split(self.linear1((1 + scale) * self.pre_norm(x) + shift),
                               [3 * self.hidden_size, self.mlp_hidden_dim], dim=-1)
        q, k, v = _split_heads(qkv, self.num_heads)
        q, k = self.norm(q, k, v)
        attn = attention(q, k, v, pe=pe)
        output = self.linear2(torch.cat((attn, self.mlp_act(mlp)), dim=2))
        return fp16_fix(x + gate * output)


class LastLayer(nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x, vec):
        shift, scale = self.adaLN_modulation(vec).chunk(2, dim=1)
        return self.linear((1 + scale[:, None, :]) * self.norm_final(x) + shift[:, None, :])


class IntegratedFluxTransformer2DModel(nn.Module):
    def __init__(self, in_channels, vec_in_dim, context_in_dim, hidden_size, mlp_ratio, num_heads, depth,
                 depth_single_blocks, axes_dim, theta, qkv_bias, guidance_embed):
        super().__init__()
        self.guidance_embed = guidance_embed
        self.in_channels = in_channels * 4
        self.out_channels = self.in_channels
        pe_dim = hidden_size // num_heads
        assert hidden_size % num_heads == 0 and sum(axes_dim) == pe_dim
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.pe_embedder = EmbedND(dim=pe_dim, theta=theta, axes_dim=axes_dim)
        self.img_in = nn.Linear(self.in_channels, hidden_size, bias=True)
        self.time_in = MLPEmbedder(in_dim=256, hidden_dim=hidden_size)
        self.vector_in = MLPEmbedder(vec_in_dim, hidden_size)
        self.guidance_in = MLPEmbedder(in_dim=256, hidden_dim=hidden_size) if guidance_embed else nn.Identity()
        self.txt_in = nn.Linear(context_in_dim, hidden_size)
        self.double_blocks = nn.ModuleList([DoubleStreamBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio,
                                                              qkv_bias=qkv_bias) for _ in range(depth)])
        self.single_blocks = nn.ModuleList([SingleStreamBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio)
                                            for _ in range(depth_single_blocks)])
        self.final_layer = LastLayer(hidden_size, 1, self.out_channels)

    def inner_forward(self, img, img_ids, txt, txt_ids, timesteps, y, guidance=None):
        img = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps, 256).to(img.dtype))
        if self.guidance_embed:
            vec = vec + self.guidance_in(timestep_embedding(guidance, 256).to(img.dtype))
        vec = vec + self.vector_in(y)
        txt = self.txt_in(txt)
        pe = self.pe_embedder(torch.cat((txt_ids, img_ids), dim=1))
        for block in self.double_blocks:
            img, txt = block(img=img, txt=txt, vec=vec, pe=pe)
        img = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            img = block(img, vec=vec, pe=pe)
        img = img[:, txt.shape[1]:, ...]
        return self.final_layer(img, vec)

    def forward(self, x, timestep, context, y, guidance=None, **kwargs):
        bs, c, h, w = x.shape
        patch = 2
        x = nn.functional.pad(x, (0, (patch - w % patch) % patch, 0, (patch - h % patch) % patch), mode="circular")
        h_len, w_len = (h + patch // 2) // patch, (w + patch // 2) // patch
        # rearrange "b c (h ph) (w pw) -> b (h w) (c ph pw)"
        img = x.view(bs, c, h_len, patch, w_len, patch).permute(0, 2, 4, 1, 3, 5).reshape(bs, h_len * w_len, -1)
        img_ids = torch.zeros((h_len, w_len, 3), device=x.device, dtype=x.dtype)
        img_ids[..., 1] += torch.linspace(0, h_len - 1, steps=h_len, device=x.device, dtype=x.dtype)[:, None]
        img_ids[..., 2] += torch.linspace(0, w_len - 1, steps=w_len, device=x.device, dtype=x.dtype)[None, :]
        img_ids = img_ids.reshape(1, h_len * w_len, 3).expand(bs, -1, -1)  # repeat "h w c -> b (h w) c"
        txt_ids = torch.zeros((bs, context.shape[1], 3), device=x.device, dtype=x.dtype)
        out = self.inner_forward(img, img_ids, context, txt_ids, timestep, y, guidance)
        # rearrange "b (h w) (c ph pw) -> b c (h ph) (w pw)"
        out = out.view(bs, h_len, w_len, -1, patch, patch).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(bs, -1, h_len * patch, w_len * patch)[:, :, :h, :w]
