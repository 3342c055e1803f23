"""Kernel-backed copies of ComfyUI's diffusion-transformer blocks: SD3 / SD3.5's MMDiT (comfy/ldm/modules/
diffusionmodules/mmdit.py: JointBlock, FinalLayer) and Flux (comfy/ldm/flux/layers.py: DoubleStreamBlock,
SingleStreamBlock, LastLayer), for the ComfyUI node's object patches.

Each block's chain runs as modules/mmdit.py runs diffusers' blocks:
    ada_layer_norm (norm1 and its modulation) -> qkv -> rms_norm (the Q / K RMSNorm of both streams, their join and
    Flux's rotary embedding) -> ComfyUI's own attention function -> add_ada_layer_norm (gated residual, norm2 and
    its modulation) -> the MLP's first Linear with GELU(tanh) -> gated residual.
The attention is the function ComfyUI's block calls (its module's `optimized_attention`, Flux's `attention`), so the
node's attention override, or whatever ComfyUI chose, runs it. The blocks' Linears are called as ComfyUI's modules:
LoRA weight patches, low-VRAM casting and weights quantized by ComfyUI (comfy-kitchen's layouts) stay ComfyUI's.
Only the bias+GELU epilogue and Flux's split output projection read a Linear's weight themselves, and only where
ComfyUI would run that Linear on the weight it holds (`plain_linear`).

A copy is a second face of the block (host_copies.host_face): it shares the block's attribute dictionary, so its
children and parameters (a LoRA'd Q / K norm scale too) are read at call time. Calls this does not cover (per-token
modulation, modulation_dims, arguments of another ComfyUI version, checkpointing with gradients) run the block's own
forward, and so do calls with transformer patches (newer ComfyUI runs some inside its blocks); blocks of another
structure are never copied (`block_problem`).
"""
from __future__ import annotations

import inspect
import sys
import weakref
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.ada_layer_norm import ada_layer_norm, add_ada_layer_norm
from ..ops.rms_norm import rms_norm
from .host_copies import face_class, host_face, unpatched
from .mmdit import gated, linear_gelu_tanh, split_proj_out

MMDIT = "comfy.ldm.modules.diffusionmodules.mmdit"
FLUX = "comfy.ldm.flux.layers"
FLUX_RMS_EPS = 1e-6  # comfy/ldm/flux/layers.py RMSNorm.forward: fixed, not an attribute


def _never(module: nn.Module) -> bool:
    return False


def _host_module(block: nn.Module):
    """The ComfyUI module that defines the block's class: its attention functions, read at call time."""
    return sys.modules[type(unpatched(block)).__module__]


# ---- pieces shared by the blocks ---------------------------------------------------------------------------------

def plain_linear(linear: nn.Module, x: torch.Tensor, host_path: Callable[[nn.Module], bool]) -> bool:
    """Whether ComfyUI would run `linear` as x @ weight.T + bias with the weight and bias it holds: an nn.Linear or one
    of comfy.ops' Linears (no other class: a LoRA node's or a copy's forward is its own), not cast or patched per call
    (host_path), its tensors plain (not a quantized tensor subclass) and already in x's dtype on x's device."""
    if type(linear).__module__ not in ("torch.nn.modules.linear", "comfy.ops") or not isinstance(linear, nn.Linear):
        return False
    if unpatched(linear) is not linear or host_path(linear):
        return False
    return all(t is None or (type(t) in (nn.Parameter, torch.Tensor) and t.dtype == x.dtype and t.device == x.device)
               for t in (linear.weight, linear.bias))


def _gelu_mlp(fc1: nn.Module, fc2: nn.Module, x: torch.Tensor, host_path) -> torch.Tensor:
    """fc2(gelu_tanh(fc1(x))), fc1's bias and GELU in its GEMM's epilogue where fc1 is plain."""
    return fc2(linear_gelu_tanh(fc1, x, plain=plain_linear(fc1, x, host_path)))


def _is_gelu_tanh(module) -> bool:
    return type(module) is nn.GELU and module.approximate == "tanh"


def _no_affine_layer_norm(norm) -> bool:
    return (isinstance(norm, nn.LayerNorm) and len(norm.normalized_shape) == 1 and norm.weight is None
            and norm.bias is None)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as the row kernels read it: contiguous (a slice of the joined streams, a transposed patch embedding, are
    not; ComfyUI's LayerNorm copies such an input too)."""
    return x.contiguous()


def _cast(weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """A norm's weight in x's dtype on x's device, as comfy.rmsnorm.rms_norm casts it (model_management.cast_to)."""
    return None if weight is None else weight.to(device=x.device, dtype=x.dtype)


def _flux_chunks(out) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(shift, scale, gate) of a Flux ModulationOut, each (B, 1, C) -> a (B, C) view."""
    return out.shift[:, 0], out.scale[:, 0], out.gate[:, 0]


def _patched(options) -> bool:
    """Whether the call carries transformer patches (other nodes' Python hooks): newer ComfyUI runs some inside its
    blocks' forwards, which these copies do not; such calls run the block's own forward."""
    return bool(isinstance(options, dict) and options.get("patches"))


def _signature(function) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()


_ROPE: list = [None, None]  # (a weak reference to the last rope tensor converted, its (cos, sin))


def _rotary(pe: torch.Tensor | None, rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(cos, sin), (rows, D) float32, of ComfyUI's Flux rope tensor `pe` (1, 1, rows, D/2, 2, 2): per channel pair
    the rotation [[cos, -sin], [sin, cos]] (comfy/ldm/flux/math.py rope), which rocm_sd::rms_norm applies as diffusers'
    apply_rotary_emb does with cos / sin repeated per pair. None where pe is absent, per sample (batch > 1: one table
    per sample, which the op does not take) or for other rows: ComfyUI's attention then applies it. Converted once per
    pe (every block of one evaluation gets the same tensor)."""
    if pe is None or pe.dim() != 6 or pe.shape[:2] != (1, 1) or pe.shape[2] != rows or pe.shape[-2:] != (2, 2) \
            or pe.dtype != torch.float32:
        return None
    if _ROPE[0] is not None and _ROPE[0]() is pe:
        return _ROPE[1]
    pairs = pe[0, 0, :, :, :, 0]  # (rows, D/2, 2): the first column, (cos, sin)
    table = tuple(pairs[..., i].repeat_interleave(2, dim=-1).contiguous() for i in (0, 1))
    _ROPE[:] = [weakref.ref(pe), table]
    return table


# ---- SD3 / SD3.5: JointBlock (a context and an x DismantledBlock) and FinalLayer --------------------------------

def _qk_norm(norm) -> tuple | None:
    """("rms", eps) for mmdit's RMSNorm, ("none",) for Identity, None for anything else (qk_norm="ln")."""
    if type(norm) is nn.Identity:
        return ("none",)
    if type(norm).__name__ == "RMSNorm" and type(norm).__module__ == MMDIT:
        return ("rms", norm.eps)
    return None


def _dismantled_problem(block) -> str | None:
    if getattr(block, "scale_mod_only", True):
        return "scale-only modulation (scale_mod_only)"
    if not _no_affine_layer_norm(block.norm1) or not (block.pre_only or _no_affine_layer_norm(block.norm2)):
        return "its norms are not LayerNorms without affine parameters (rmsnorm)"
    mlp = getattr(block, "mlp", None)
    if not block.pre_only and not (type(mlp).__name__ == "Mlp" and isinstance(mlp.fc1, nn.Linear)
                                   and isinstance(mlp.fc2, nn.Linear) and _is_gelu_tanh(mlp.act)
                                   and type(mlp.norm) is nn.Identity):
        return "its MLP is not Linear -> GELU(tanh) -> Linear (swiglu)"
    attentions = [block.attn] + ([block.attn2] if block.x_block_self_attn else [])
    for attn in attentions:
        kinds = _qk_norm(attn.ln_q), _qk_norm(attn.ln_k)
        if None in kinds or kinds[0] != kinds[1]:
            return "its Q / K norms are not RMSNorms (qk_norm='ln')"
    return None


def _joint_block_problem(block) -> str | None:
    host = _host_module(block)
    if _signature(getattr(host, "_block_mixing", None)) != ("context", "x", "context_block", "x_block", "c",
                                                            "transformer_options"):
        return "this ComfyUI's _block_mixing is not the one rocm_sd follows"
    context, x = block.context_block, block.x_block
    if x.pre_only or context.x_block_self_attn:
        return "an x block without post-attention, or a context block with its own self-attention"
    problem = _dismantled_problem(context) or _dismantled_problem(x)
    if problem:
        return problem
    if (_qk_norm(context.attn.ln_q) != _qk_norm(x.attn.ln_q) or context.attn.num_heads != x.attn.num_heads
            or context.attn.head_dim != x.attn.head_dim):
        return "its two streams' attentions differ in Q / K norms or heads"
    return None


def _heads(attn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mmdit's split_qkv: q, k, v (B, L, H, D) views of attn.qkv(x)."""
    qkv = attn.qkv(x)
    return qkv.view(qkv.shape[0], qkv.shape[1], 3, -1, attn.head_dim).unbind(2)


def _normed(x: torch.Tensor, norm, lead: torch.Tensor | None = None, lead_norm=None) -> torch.Tensor:
    """cat([lead_norm(lead), norm(x)], dim=1) (B, L0 + L, H, D): one rocm_sd::rms_norm for mmdit's RMSNorms
    (_joint_block_problem checked both are of one kind)."""
    if type(norm) is nn.Identity:
        return x if lead is None else torch.cat([lead, x], dim=1)
    return rms_norm.call(x, _cast(norm.weight, x), norm.eps, lead, None if lead is None else _cast(lead_norm.weight, x))


def _post(block, x: torch.Tensor, attention_out: torch.Tensor, attn, gate_msa, shift_mlp, scale_mlp, gate_mlp,
          host_path) -> torch.Tensor:
    """DismantledBlock.post_attention: x + gate_msa * proj(attention), then + gate_mlp * mlp(modulated norm2)."""
    h, n = add_ada_layer_norm.call(_rows(x), attn.post_attention(attention_out), gate_msa, scale_mlp, shift_mlp,
                                   block.norm2.eps)
    return gated(h, gate_mlp, _gelu_mlp(block.mlp.fc1, block.mlp.fc2, n, host_path))


def _joint_block(base: type, self, *args, **kwargs):
    """JointBlock.forward: mmdit's _block_mixing with the chains fused. (context, x) out, as ComfyUI's."""
    options = kwargs.get("transformer_options", {})
    context, x = args if len(args) == 2 else (None, None)
    c = kwargs.get("c")
    if (set(kwargs) - {"c", "use_checkpoint", "transformer_options"} or not isinstance(context, torch.Tensor)
            or not isinstance(c, torch.Tensor) or c.dim() != 2 or _patched(options)
            or kwargs.get("use_checkpoint", True) and torch.is_grad_enabled()):
        return base.forward(self, *args, **kwargs)  # checkpointing for training, or a call of another form
    attention = _host_module(self).optimized_attention
    cb, xb, host_path = self.context_block, self.x_block, self.rocm_sd_host_path
    c_mods = cb.adaLN_modulation(c).chunk(2 if cb.pre_only else 6, dim=1)
    x_mods = xb.adaLN_modulation(c).chunk(9 if xb.x_block_self_attn else 6, dim=1)
    cq, ck, cv = _heads(cb.attn, ada_layer_norm.call(_rows(context), c_mods[1], c_mods[0], cb.norm1.eps))
    xq, xk, xv = _heads(xb.attn, ada_layer_norm.call(_rows(x), x_mods[1], x_mods[0], xb.norm1.eps))
    q = _normed(xq, xb.attn.ln_q, cq, cb.attn.ln_q).flatten(2)  # the context's rows first, as ComfyUI joins them
    k = _normed(xk, xb.attn.ln_k, ck, cb.attn.ln_k).flatten(2)
    v = torch.cat((cv, xv), dim=1).flatten(2)
    out = attention(q, k, v, heads=xb.attn.num_heads, transformer_options=options)
    context_out, x_out = out[:, :context.shape[1]], out[:, context.shape[1]:]

    context = None if cb.pre_only else _post(cb, context, context_out, cb.attn, *c_mods[2:6], host_path)
    gate_msa = x_mods[2]
    if xb.x_block_self_attn:  # SD3.5 Medium: a second self-attention of x, from norm1 with its own modulation
        q2, k2, v2 = _heads(xb.attn2, ada_layer_norm.call(_rows(x), x_mods[7], x_mods[6], xb.norm1.eps))
        x_out2 = attention(_normed(q2, xb.attn2.ln_q).flatten(2), _normed(k2, xb.attn2.ln_k).flatten(2),
                           v2.flatten(2), heads=xb.attn2.num_heads, transformer_options=options)
        x = gated(x, gate_msa, xb.attn.post_attention(x_out))
        x_out, gate_msa, attn = x_out2, x_mods[8], xb.attn2
    else:
        attn = xb.attn
    return context, _post(xb, x, x_out, attn, gate_msa, *x_mods[3:6], host_path)


def _final_layer(base: type, self, x, c):
    """mmdit's FinalLayer: linear(modulate(norm_final(x), shift, scale))."""
    if not isinstance(c, torch.Tensor) or c.dim() != 2:
        return base.forward(self, x, c)
    shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
    return self.linear(ada_layer_norm.call(_rows(x), scale, shift, self.norm_final.eps))


# ---- Flux: DoubleStreamBlock, SingleStreamBlock, LastLayer ------------------------------------------------------

_DOUBLE_FORWARD = ("self", "img", "txt", "vec", "pe", "attn_mask", "modulation_dims_img", "modulation_dims_txt",
                   "transformer_options")
_SINGLE_FORWARD = ("self", "x", "vec", "pe", "attn_mask", "modulation_dims", "transformer_options")
_ATTENTION = ("q", "k", "v", "pe", "mask", "transformer_options")


def _flux_qk_norm(norm) -> bool:
    norms = (getattr(norm, "query_norm", None), getattr(norm, "key_norm", None))
    return type(norm).__name__ == "QKNorm" and all(
        type(n).__name__ == "RMSNorm" and type(n).__module__ == FLUX and isinstance(getattr(n, "scale", None),
                                                                                     torch.Tensor) for n in norms)


def _flux_mlp(mlp) -> bool:
    return (isinstance(mlp, nn.Sequential) and len(mlp) == 3 and isinstance(mlp[0], nn.Linear)
            and _is_gelu_tanh(mlp[1]) and isinstance(mlp[2], nn.Linear))


def _flux_version_problem(block, forward_arguments: tuple[str, ...]) -> str | None:
    if _signature(type(unpatched(block)).forward) != forward_arguments:
        return "its forward takes other arguments than the ComfyUI version rocm_sd follows"
    if _signature(getattr(_host_module(block), "attention", None))[:len(_ATTENTION)] != _ATTENTION:
        return "this ComfyUI's flux attention function takes other arguments"
    return None


def _double_block_problem(block) -> str | None:
    known = {"img_mod", "img_norm1", "img_attn", "img_norm2", "img_mlp",
             "txt_mod", "txt_norm1", "txt_attn", "txt_norm2", "txt_mlp"}
    if set(block._modules) != known:
        return f"its parts {sorted(set(block._modules) ^ known)} differ from the Flux block rocm_sd follows"
    if not all(_no_affine_layer_norm(getattr(block, f"{s}_norm{i}")) for s in ("img", "txt") for i in (1, 2)):
        return "its norms are not LayerNorms without affine parameters"
    if not all(_flux_qk_norm(getattr(block, f"{s}_attn").norm) and _flux_mlp(getattr(block, f"{s}_mlp"))
               and getattr(block, f"{s}_mod").is_double for s in ("img", "txt")):
        return "its Q / K norms, MLPs or modulations differ from Flux's"
    return _flux_version_problem(block, _DOUBLE_FORWARD)


def _single_block_problem(block) -> str | None:
    known = {"linear1", "linear2", "norm", "pre_norm", "mlp_act", "modulation"}
    if set(block._modules) != known:
        return f"its parts {sorted(set(block._modules) ^ known)} differ from the Flux block rocm_sd follows"
    if not (_no_affine_layer_norm(block.pre_norm) and _is_gelu_tanh(block.mlp_act) and _flux_qk_norm(block.norm)
            and not block.modulation.is_double
            and block.linear2.in_features == block.hidden_size + block.mlp_hidden_dim):
        return "its norms, activation or projections differ from Flux's"
    return _flux_version_problem(block, _SINGLE_FORWARD)


def _flux_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, L, H, D) views of a (B, L, 3 * H * D) projection, as Flux's view(B, L, 3, H, -1)."""
    return qkv.view(qkv.shape[0], qkv.shape[1], 3, heads, -1).unbind(2)


def _flux_normed(x, norm, pe, lead=None, lead_norm=None) -> tuple[torch.Tensor, bool]:
    """(cat([lead_norm(lead), norm(x)], dim=1) rotated by pe where _rotary converts it, as one rocm_sd::rms_norm
    (B, L0 + L, H, D); whether it is rotated)."""
    rows = x.shape[1] + (0 if lead is None else lead.shape[1])
    rotary = _rotary(pe, rows) or (None, None)
    y = rms_norm.call(x, _cast(norm.scale, x), FLUX_RMS_EPS, lead,
                      None if lead is None else _cast(lead_norm.scale, x), *rotary)
    return y, rotary[0] is not None


def _flux_attention(block, q, k, v, pe, rotated: bool, mask, options) -> torch.Tensor:
    """Flux's attention function of the block's ComfyUI (q, k, v as (B, H, L, D)), with pe where not applied yet."""
    attention = _host_module(block).attention
    return attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), pe=None if rotated else pe, mask=mask,
                     transformer_options=options)


def _clip_fp16(x: torch.Tensor) -> torch.Tensor:
    """Flux's blocks clamp fp16 streams (ComfyUI's nan_to_num)."""
    return torch.nan_to_num(x, nan=0.0, posinf=65504, neginf=-65504) if x.dtype == torch.float16 else x


def _double_block(base: type, self, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None,
                  modulation_dims_txt=None, transformer_options={}, **kwargs):
    """DoubleStreamBlock.forward with the chains fused; (img, txt) out, as ComfyUI's."""
    if (kwargs or modulation_dims_img is not None or modulation_dims_txt is not None
            or not isinstance(vec, torch.Tensor) or vec.dim() != 2 or _patched(transformer_options)):
        return base.forward(self, img, txt, vec, pe, attn_mask, modulation_dims_img, modulation_dims_txt,
                            transformer_options, **kwargs)
    host_path = self.rocm_sd_host_path
    streams = {}
    for name, x in (("img", img), ("txt", txt)):
        mod1, mod2 = getattr(self, f"{name}_mod")(vec)
        shift, scale, gate = _flux_chunks(mod1)
        attn = getattr(self, f"{name}_attn")
        qkv = _flux_heads(attn.qkv(ada_layer_norm.call(_rows(x), scale, shift, getattr(self, f"{name}_norm1").eps)),
                          self.num_heads)
        streams[name] = (x, attn, qkv, gate, _flux_chunks(mod2))
    first, second = ("img", "txt") if self.flipped_img_txt else ("txt", "img")
    (_, lead_attn, lead, *_), (_, attn, qkv, *_) = streams[first], streams[second]
    q, rotated = _flux_normed(qkv[0], attn.norm.query_norm, pe, lead[0], lead_attn.norm.query_norm)
    k, _ = _flux_normed(qkv[1], attn.norm.key_norm, pe, lead[1], lead_attn.norm.key_norm)
    v = torch.cat((lead[2], qkv[2]), dim=1)
    out = _flux_attention(self, q, k, v, pe, rotated, attn_mask, transformer_options)
    split = streams[first][0].shape[1]
    outputs = {first: out[:, :split], second: out[:, split:]}
    for name in ("img", "txt"):
        x, attn, _, gate, (shift, scale, gate_mlp) = streams[name]
        mlp, norm2 = getattr(self, f"{name}_mlp"), getattr(self, f"{name}_norm2")
        h, n = add_ada_layer_norm.call(_rows(x), attn.proj(outputs[name]), gate, scale, shift, norm2.eps)
        streams[name] = gated(h, gate_mlp, _gelu_mlp(mlp[0], mlp[2], n, host_path))
    return streams["img"], _clip_fp16(streams["txt"])


def _single_block(base: type, self, x, vec, pe, attn_mask=None, modulation_dims=None, transformer_options={},
                  **kwargs):
    """SingleStreamBlock.forward with the AdaLN and Q / K RMSNorm (+ rope) fused, and linear2 of [attention, MLP] as
    two GEMMs into one output where linear2 is plain."""
    if (kwargs or modulation_dims is not None or not isinstance(vec, torch.Tensor) or vec.dim() != 2
            or _patched(transformer_options)):
        return base.forward(self, x, vec, pe, attn_mask, modulation_dims, transformer_options, **kwargs)
    mod, _ = self.modulation(vec)
    shift, scale, gate = _flux_chunks(mod)
    qkv, mlp = torch.split(self.linear1(ada_layer_norm.call(_rows(x), scale, shift, self.pre_norm.eps)),
                           [3 * self.hidden_size, self.mlp_hidden_dim], dim=-1)
    q, k, v = _flux_heads(qkv, self.num_heads)
    q, rotated = _flux_normed(q, self.norm.query_norm, pe)
    k, _ = _flux_normed(k, self.norm.key_norm, pe)
    attention = _flux_attention(self, q, k, v, pe, rotated, attn_mask, transformer_options)
    mlp = F.gelu(mlp, approximate="tanh")
    if plain_linear(self.linear2, attention, self.rocm_sd_host_path):
        out = split_proj_out(self.linear2, attention, mlp).view(*x.shape[:-1], self.linear2.out_features)
    else:
        out = self.linear2(torch.cat((attention, mlp), 2))
    return _clip_fp16(gated(x, gate, out))


def _last_layer(base: type, self, x, vec, modulation_dims=None):
    """Flux's LastLayer: linear(modulate(norm_final(x), shift, scale))."""
    if modulation_dims is not None or not isinstance(vec, torch.Tensor) or vec.dim() != 2:
        return base.forward(self, x, vec, modulation_dims)
    shift, scale = self.adaLN_modulation(vec).chunk(2, dim=1)
    return self.linear(ada_layer_norm.call(_rows(x), scale, shift, self.norm_final.eps))


def _final_problem(layer) -> str | None:
    if not _no_affine_layer_norm(layer.norm_final):
        return "its norm is not a LayerNorm without affine parameters"
    return None


# (module, class name) -> (the fused forward, why a block of that class cannot take it)
BLOCKS = {(MMDIT, "JointBlock"): (_joint_block, _joint_block_problem),
          (MMDIT, "FinalLayer"): (_final_layer, _final_problem),
          (FLUX, "DoubleStreamBlock"): (_double_block, _double_block_problem),
          (FLUX, "SingleStreamBlock"): (_single_block, _single_block_problem),
          (FLUX, "LastLayer"): (_last_layer, _final_problem)}


def block_kind(module) -> tuple[str, str] | None:
    """(module, class name) of one of ComfyUI's transformer blocks rocm_sd has a forward for, else None."""
    key = (type(module).__module__, type(module).__name__)
    return key if key in BLOCKS else None


def block_problem(block: nn.Module) -> str | None:
    """Why the block's structure does not take the fused forward (another configuration or ComfyUI version), or None."""
    kind = block_kind(block)
    if kind is None:
        return f"{type(block).__name__} is not one of ComfyUI's SD3 / Flux blocks"
    try:
        return BLOCKS[kind][1](block)
    except AttributeError as error:  # a part the fused forward reads is missing
        return f"it lacks a part rocm_sd reads ({error})"


def dit_block_copy(block: nn.Module, host_path: Callable[[nn.Module], bool] = _never) -> nn.Module:
    """`block` running its fused forward, unless the call is of another form (the module doc). `host_path(linear)`:
    whether ComfyUI casts or patches that Linear's weight per call (then it runs the Linear's own forward)."""
    block = unpatched(block)
    kind = block_kind(block)
    if kind is None:
        raise TypeError(f"expected one of ComfyUI's SD3 / Flux blocks, got {type(block).__name__}")
    base, fused = type(block), BLOCKS[kind][0]

    def forward(self, *args, **kwargs):
        return fused(base, self, *args, **kwargs)

    new = host_face(block, face_class(base, "dit", forward))
    new.rocm_sd_host_path = host_path
    return new
