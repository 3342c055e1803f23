"""comfy.ldm.modules.diffusionmodules.mmdit as at a125cd84: SD3 / SD3.5's DismantledBlock (SD3.5 Medium's
x_block_self_attn too), _block_mixing, JointBlock and FinalLayer with their forwards op for op as ComfyUI's; MMDiT
reduced (a patch embedding, sinusoidal timestep and pooled-text embedders, no position embedding or registers)."""
import math
from functools import partial

import torch
import torch.nn as nn

import comfy.ldm.common_dit
from comfy import ops
from ..attention import optimized_attention


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, norm_layer=None,
                 bias=True, drop=0., use_conv=False, dtype=None, device=None, operations=None):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        linear_layer = partial(operations.Conv2d, kernel_size=1) if use_conv else operations.Linear
        self.fc1 = linear_layer(in_features, hidden_features, bias=bias, dtype=dtype, device=device)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = linear_layer(hidden_features, out_features, bias=bias, dtype=dtype, device=device)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


def modulate(x, shift, scale):
    if shift is None:
        shift = torch.zeros_like(scale)
    return torch.addcmul(shift.unsqueeze(1), x, 1 + scale.unsqueeze(1))


def split_qkv(qkv, head_dim):
    qkv = qkv.reshape(qkv.shape[0], qkv.shape[1], 3, -1, head_dim).movedim(2, 0)
    return qkv[0], qkv[1], qkv[2]


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, elementwise_affine=False, eps=1e-6, device=None, dtype=None, **kwargs):
        super().__init__()
        self.eps = eps
        self.learnable_scale = elementwise_affine
        if self.learnable_scale:
            self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        return comfy.ldm.common_dit.rms_norm(x, self.weight, self.eps)


class SelfAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_scale=None, proj_drop=0.0, attn_mode="xformers",
                 pre_only=False, qk_norm=None, rmsnorm=False, dtype=None, device=None, operations=None):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = operations.Linear(dim, dim * 3, bias=qkv_bias, dtype=dtype, device=device)
        if not pre_only:
            self.proj = operations.Linear(dim, dim, dtype=dtype, device=device)
            self.proj_drop = nn.Dropout(proj_drop)
        self.pre_only = pre_only
        if qk_norm == "rms":
            self.ln_q = RMSNorm(self.head_dim, elementwise_affine=True, eps=1.0e-6, dtype=dtype, device=device)
            self.ln_k = RMSNorm(self.head_dim, elementwise_affine=True, eps=1.0e-6, dtype=dtype, device=device)
        elif qk_norm == "ln":
            self.ln_q = operations.LayerNorm(self.head_dim, elementwise_affine=True, eps=1.0e-6, dtype=dtype,
                                             device=device)
            self.ln_k = operations.LayerNorm(self.head_dim, elementwise_affine=True, eps=1.0e-6, dtype=dtype,
                                             device=device)
        else:
            self.ln_q, self.ln_k = nn.Identity(), nn.Identity()

    def pre_attention(self, x):
        q, k, v = split_qkv(self.qkv(x), self.head_dim)
        q = self.ln_q(q).reshape(q.shape[0], q.shape[1], -1)
        k = self.ln_k(k).reshape(q.shape[0], q.shape[1], -1)
        return (q, k, v)

    def post_attention(self, x):
        assert not self.pre_only
        return self.proj_drop(self.proj(x))


class DismantledBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0, attn_mode="xformers", qkv_bias=False, pre_only=False,
                 rmsnorm=False, scale_mod_only=False, swiglu=False, qk_norm=None, x_block_self_attn=False,
                 dtype=None, device=None, operations=None, **block_kwargs):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        norm = (lambda: RMSNorm(hidden_size, elementwise_affine=False, eps=1e-6)) if rmsnorm else \
            (lambda: operations.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6, **kw))
        self.norm1 = norm()
        self.attn = SelfAttention(hidden_size, num_heads, qkv_bias, pre_only=pre_only, qk_norm=qk_norm,
                                  operations=operations, **kw)
        self.x_block_self_attn = x_block_self_attn
        if x_block_self_attn:
            self.attn2 = SelfAttention(hidden_size, num_heads, qkv_bias, pre_only=False, qk_norm=qk_norm,
                                       operations=operations, **kw)
        if not pre_only:
            self.norm2 = norm()
            self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio), act_layer=lambda: nn.GELU(approximate="tanh"),
                           drop=0, operations=operations, **kw)
        self.scale_mod_only = scale_mod_only
        n_mods = 9 if x_block_self_attn else (6 if not pre_only else 2) if not scale_mod_only else \
            (4 if not pre_only else 1)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), operations.Linear(hidden_size, n_mods * hidden_size,
                                                                           bias=True, **kw))
        self.pre_only = pre_only

    def pre_attention(self, x, c):
        if not self.pre_only:
            if not self.scale_mod_only:
                shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(
                    6, dim=1)
            else:
                shift_msa = shift_mlp = None
                scale_msa, gate_msa, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(4, dim=1)
            qkv = self.attn.pre_attention(modulate(self.norm1(x), shift_msa, scale_msa))
            return qkv, (x, gate_msa, shift_mlp, scale_mlp, gate_mlp)
        if not self.scale_mod_only:
            shift_msa, scale_msa = self.adaLN_modulation(c).chunk(2, dim=1)
        else:
            shift_msa, scale_msa = None, self.adaLN_modulation(c)
        return self.attn.pre_attention(modulate(self.norm1(x), shift_msa, scale_msa)), None

    def post_attention(self, attn, x, gate_msa, shift_mlp, scale_mlp, gate_mlp):
        assert not self.pre_only
        x = x + gate_msa.unsqueeze(1) * self.attn.post_attention(attn)
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))

    def pre_attention_x(self, x, c):
        assert self.x_block_self_attn
        (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_msa2, scale_msa2,
         gate_msa2) = self.adaLN_modulation(c).chunk(9, dim=1)
        x_norm = self.norm1(x)
        qkv = self.attn.pre_attention(modulate(x_norm, shift_msa, scale_msa))
        qkv2 = self.attn2.pre_attention(modulate(x_norm, shift_msa2, scale_msa2))
        return qkv, qkv2, (x, gate_msa, shift_mlp, scale_mlp, gate_mlp, gate_msa2)

    def post_attention_x(self, attn, attn2, x, gate_msa, shift_mlp, scale_mlp, gate_mlp, gate_msa2):
        assert not self.pre_only
        attn1 = self.attn.post_attention(attn)
        attn2 = self.attn2.post_attention(attn2)
        x = gate_cat(x, gate_msa, gate_msa2, attn1, attn2)
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


def gate_cat(x, gate_msa, gate_msa2, attn1, attn2):
    out1 = gate_msa.unsqueeze(1) * attn1
    out2 = gate_msa2.unsqueeze(1) * attn2
    return torch.stack([x, out1, out2], dim=0).sum(dim=0)


def block_mixing(*args, use_checkpoint=True, **kwargs):
    if use_checkpoint:
        return torch.utils.checkpoint.checkpoint(_block_mixing, *args, use_reentrant=False, **kwargs)
    return _block_mixing(*args, **kwargs)


def _block_mixing(context, x, context_block, x_block, c, transformer_options={}):
    context_qkv, context_intermediates = context_block.pre_attention(context, c)
    if x_block.x_block_self_attn:
        x_qkv, x_qkv2, x_intermediates = x_block.pre_attention_x(x, c)
    else:
        x_qkv, x_intermediates = x_block.pre_attention(x, c)
    qkv = tuple(torch.cat((context_qkv[t], x_qkv[t]), dim=1) for t in range(3))
    attn = optimized_attention(qkv[0], qkv[1], qkv[2], heads=x_block.attn.num_heads,
                               transformer_options=transformer_options)
    context_attn, x_attn = attn[:, : context_qkv[0].shape[1]], attn[:, context_qkv[0].shape[1]:]
    context = None if context_block.pre_only else context_block.post_attention(context_attn, *context_intermediates)
    if x_block.x_block_self_attn:
        attn2 = optimized_attention(x_qkv2[0], x_qkv2[1], x_qkv2[2], heads=x_block.attn2.num_heads,
                                    transformer_options=transformer_options)
        x = x_block.post_attention_x(x_attn, attn2, *x_intermediates)
    else:
        x = x_block.post_attention(x_attn, *x_intermediates)
    return context, x


class JointBlock(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        pre_only = kwargs.pop("pre_only")
        qk_norm = kwargs.pop("qk_norm", None)
        x_block_self_attn = kwargs.pop("x_block_self_attn", False)
        self.context_block = DismantledBlock(*args, pre_only=pre_only, qk_norm=qk_norm, **kwargs)
        self.x_block = DismantledBlock(*args, pre_only=False, qk_norm=qk_norm, x_block_self_attn=x_block_self_attn,
                                       **kwargs)

    def forward(self, *args, **kwargs):
        return block_mixing(*args, context_block=self.context_block, x_block=self.x_block, **kwargs)


class FinalLayer(nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels, dtype=None, device=None, operations=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.norm_final = operations.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6, **kw)
        self.linear = operations.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True, **kw)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), operations.Linear(hidden_size, 2 * hidden_size, bias=True,
                                                                           **kw))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class MMDiT(nn.Module):
    """As ComfyUI's: hidden size 64 * depth, `depth` heads of 64, the last block's context stream pre-only."""

    def __init__(self, patch_size=2, in_channels=4, depth=2, mlp_ratio=4.0, adm_in_channels=8, context_dim=24,
                 qk_norm=None, x_block_self_attn_layers=(), rmsnorm=False, swiglu=False, use_checkpoint=False,
                 dtype=None, device=None, operations=ops.disable_weight_init):
        super().__init__()
        self.patch_size, self.out_channels = patch_size, in_channels
        self.hidden_size, self.use_checkpoint = 64 * depth, use_checkpoint
        kw = dict(dtype=dtype, device=device, operations=operations)
        self.x_proj = operations.Conv2d(in_channels, self.hidden_size, patch_size, stride=patch_size)
        self.t_embedder = operations.Linear(256, self.hidden_size)
        self.y_embedder = operations.Linear(adm_in_channels, self.hidden_size)
        self.context_embedder = operations.Linear(context_dim, self.hidden_size)
        self.joint_blocks = nn.ModuleList([
            JointBlock(self.hidden_size, depth, mlp_ratio=mlp_ratio, qkv_bias=True, pre_only=i == depth - 1,
                       rmsnorm=rmsnorm, swiglu=swiglu, qk_norm=qk_norm,
                       x_block_self_attn=i in x_block_self_attn_layers, **kw) for i in range(depth)])
        self.final_layer = FinalLayer(self.hidden_size, patch_size, self.out_channels, **kw)

    def forward(self, x, t, y=None, context=None, control=None, transformer_options={}):
        b, _, h, w = x.shape
        p = self.patch_size
        x = self.x_proj(x).flatten(2).transpose(1, 2)
        half = 128
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=x.device) / half)
        args = t[:, None].float() * freqs[None]
        c = self.t_embedder(torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(x.dtype))
        if y is not None:
            c = c + self.y_embedder(y)
        context = self.context_embedder(context)
        for block in self.joint_blocks:
            context, x = block(context, x, c=c, use_checkpoint=self.use_checkpoint,
                               transformer_options=transformer_options)
        x = self.final_layer(x, c)
        x = x.reshape(b, h // p, w // p, p, p, self.out_channels)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(b, self.out_channels, h, w)


class OpenAISignatureMMDITWrapper(MMDiT):
    def forward(self, x, timesteps, context=None, y=None, control=None, transformer_options={}, **kwargs):
        return super().forward(x, timesteps, context=context, y=y, control=control,
                               transformer_options=transformer_options)
