"""Kernel-backed copies of ComfyUI's diffusion-transformer blocks: SD3 / SD3.5's MMDiT (comfy/ldm/modules/
diffusionmodules/mmdit.py: JointBlock, FinalLayer) and Flux (comfy/ldm/flux/layers.py: DoubleStreamBlock,
SingleStreamBlock, LastLayer), for the ComfyUI node's object patches; and of Forge's Flux blocks (backend/nn/flux.py,
the same three classes ported from the same reference), for the A1111 extension's Forge path, which installs them
as object patches of Forge's ModelPatcher the same way. One chain per Flux block runs both ports; `_FluxPort` holds
what differs between them (the Forge section below lists it).

Each block's chain runs as modules/mmdit.py runs diffusers' blocks:
    ada_layer_norm (norm1 and its modulation) -> qkv -> rms_norm (the Q / K RMSNorm of both streams, their join and
    Flux's rotary embedding) -> the host's own attention function -> add_ada_layer_norm (gated residual, norm2 and
    its modulation) -> the MLP's first Linear with GELU(tanh) -> gated residual.
The attention is the function ComfyUI's block calls (its module's `optimized_attention`, Flux's `attention`), so the
node's attention override, or whatever ComfyUI chose, runs it; Forge's blocks call Forge's attention_function, or
rocm_sd's attention where the extension asks (`dit_block_copy(attention=...)`). The blocks' Linears are called as
the host's modules: LoRA weight patches, low-VRAM casting and weights quantized by the host (comfy-kitchen's
layouts, Forge's GGUF / bitsandbytes) stay the host's. Only the bias+GELU epilogue and Flux's split output
projection read a Linear's weight themselves, and only where the host would run that Linear on the weight it holds
(`plain_linear`).

A copy is a second face of the block (host_copies.host_face): it shares the block's attribute dictionary, so its
children and parameters (a LoRA'd Q / K norm scale too) are read at call time. Calls this does not cover (per-token
modulation, modulation_dims, arguments of another host version, checkpointing with gradients) run the block's own
forward, and so do calls with transformer patches (newer ComfyUI runs some inside its blocks); blocks of another
structure are never copied (`block_problem`).
"""
from __future__ import annotations

import inspect
import sys
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.ada_layer_norm import ada_layer_norm
from ..ops.rms_norm import rms_norm
from .host_copies import face_class, host_face, unpatched
from .mmdit import addmm_gelu_tanh, gated, linear_gelu_tanh, split_proj_out
from .mmdit_8bit import add_modulated, gelu_for, mlp_gelu, modulated
from .quantized_linear import (EightBit, QuantizedHostCopy, eight_bit, forward_8bit_blocks, forward_8bit_parts,
                               rows_device)
from .joint_rows import joint_qkv, linear_rows

MMDIT = "comfy.ldm.modules.diffusionmodules.mmdit"
FLUX = "comfy.ldm.flux.layers"
FLUX_RMS_EPS = 1e-6  # comfy/ldm/flux/layers.py RMSNorm.forward: fixed, not an attribute


def _never(module: nn.Module) -> bool:
    return False


def _host_module(block: nn.Module):
    """The host's module that defines the block's class: its attention functions, read at call time."""
    return sys.modules[type(unpatched(block)).__module__]


# ---- pieces shared by the blocks ---------------------------------------------------------------------------------

def _forge_linear_patched(linear: nn.Module) -> bool:
    """Whether Forge's ForgeOperations.Linear computes its weight per call: cast and moved (parameters_manual_cast, its
    low-VRAM offloading too), scaled (scale_weight, fp8 scaled checkpoints) or merged with online LoRA."""
    return bool(getattr(linear, "parameters_manual_cast", False) or getattr(linear, "scale_weight", None) is not None
                or getattr(linear, "forge_online_loras", None))


def plain_linear(linear: nn.Module, x: torch.Tensor, host_path: Callable[[nn.Module], bool]) -> bool:
    """Whether the host would run `linear` as x @ weight.T + bias with the weight and bias it holds: an nn.Linear, one
    of comfy.ops' Linears or Forge's ForgeOperations.Linear where it does not compute its weight per call (no other
    class: a LoRA node's, a quantized one's or a copy's forward is its own), not cast or patched per call
    (host_path), its tensors plain (not a quantized tensor subclass) and already in x's dtype on x's device."""
    cls = type(linear)
    if (cls.__module__, cls.__qualname__) == ("backend.operations", "ForgeOperations.Linear"):
        if _forge_linear_patched(linear):
            return False
    elif cls.__module__ not in ("torch.nn.modules.linear", "comfy.ops") or not isinstance(linear, nn.Linear):
        return False
    if unpatched(linear) is not linear or host_path(linear):
        return False
    return all(t is None or (type(t) in (nn.Parameter, torch.Tensor) and t.dtype == x.dtype and t.device == x.device)
               for t in (linear.weight, linear.bias))


def _gelu_mlp(fc1: nn.Module, fc2: nn.Module, x: torch.Tensor, host_path) -> torch.Tensor:
    """fc2(gelu_tanh(fc1(x))): the GELU writing only fc2's rows where both are 8-bit copies running their GEMMs
    (mmdit_8bit.mlp_gelu), else fc1's bias and GELU in its GEMM's epilogue where fc1 is plain."""
    hidden = mlp_gelu(fc1, x, fc2)
    return fc2(linear_gelu_tanh(fc1, x, plain=plain_linear(fc1, x, host_path)) if hidden is None else hidden)


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


def _host_plain(host_path: Callable[[nn.Module], bool]) -> Callable[[nn.Module, torch.Tensor], bool]:
    """plain_linear for joint_rows: whether the host runs a Linear as the GEMM of the weight and bias it holds."""
    return lambda linear, x: plain_linear(linear, x, host_path)


def _joint_heads(first_attn, first_x, second_attn, second_x, num_heads: int, plain):
    """((q of the lead rows, q of the rest), (k ..., k ...), v): (B, L, H, D) views of the two streams' qkv
    projections (mmdit's split_qkv and Flux's view(B, L, 3, H, -1) are one layout: [q | k | v]), V joined."""
    queries, keys, v = joint_qkv(first_attn.qkv, first_x, second_attn.qkv, second_x, plain)

    def heads(t):
        return t.unflatten(-1, (num_heads, -1))
    return tuple(map(heads, queries)), tuple(map(heads, keys)), heads(v)


def _split_qkv(attn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    h, n = add_modulated(_rows(x), attn.post_attention(attention_out), gate_msa, scale_mlp, shift_mlp,
                         block.norm2.eps, [block.mlp.fc1])
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
    # each norm1 feeds only its stream's qkv: where that is an 8-bit copy, the norm writes only its rows
    c_normed = modulated(_rows(context), c_mods[1], c_mods[0], cb.norm1.eps, [cb.attn.qkv])
    x_normed = modulated(_rows(x), x_mods[1], x_mods[0], xb.norm1.eps, [xb.attn.qkv])
    # the context's rows first, as ComfyUI joins them
    (cq, xq), (ck, xk), v = _joint_heads(cb.attn, c_normed, xb.attn, x_normed, xb.attn.num_heads,
                                         _host_plain(host_path))
    q = _normed(xq, xb.attn.ln_q, cq, cb.attn.ln_q).flatten(2)
    k = _normed(xk, xb.attn.ln_k, ck, cb.attn.ln_k).flatten(2)
    v = v.flatten(2)
    out = attention(q, k, v, heads=xb.attn.num_heads, transformer_options=options)
    context_out, x_out = out[:, :context.shape[1]], out[:, context.shape[1]:]

    context = None if cb.pre_only else _post(cb, context, context_out, cb.attn, *c_mods[2:6], host_path)
    gate_msa = x_mods[2]
    if xb.x_block_self_attn:  # SD3.5 Medium: a second self-attention of x, from norm1 with its own modulation
        q2, k2, v2 = _split_qkv(xb.attn2, modulated(_rows(x), x_mods[7], x_mods[6], xb.norm1.eps, [xb.attn2.qkv]))
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
# Two ports of BFL's reference blocks: ComfyUI's (comfy/ldm/flux/layers.py) and Forge's (backend/nn/flux.py). Their
# parts carry the same names and compute the same math; one chain per block runs both, and a _FluxPort says where
# they differ: how a Modulation hands out its (shift, scale, gate) triples, which attention function the block
# calls and how, the fp16 clamp, the Q / K RMSNorm's eps, and what a block's Linears are.

@dataclass(frozen=True)
class _FluxPort:
    modulations: Callable  # (Modulation, vec) -> [(shift, scale, gate), each a (B, C) view]: one or two triples
    rope: Callable         # (block, pe) -> the rope tensor rocm_sd::rms_norm may apply (None: the attention applies pe)
    attention: Callable    # (block, q, k, v (B, L, H, D), pe, rotated, mask, options) -> (B, L, H * D)
    clip: Callable         # (block, x) -> x as the host's fp16 clamp leaves it
    rms_eps: Callable      # (RMSNorm) -> its eps


def _flux_chunks(out) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(shift, scale, gate) of a Flux ModulationOut, each (B, 1, C) -> a (B, C) view."""
    return out.shift[:, 0], out.scale[:, 0], out.gate[:, 0]


def _flux_qk_norm(norm, module: str) -> bool:
    """A QKNorm of two RMSNorms of the host's flux module `module`, each with its `scale` tensor."""
    norms = (getattr(norm, "query_norm", None), getattr(norm, "key_norm", None))
    return type(norm).__name__ == "QKNorm" and all(
        type(n).__name__ == "RMSNorm" and type(n).__module__ == module and isinstance(getattr(n, "scale", None),
                                                                                       torch.Tensor) for n in norms)


def _is_linear(module) -> bool:
    return isinstance(module, nn.Linear)


def _flux_mlp(mlp, is_linear: Callable = _is_linear) -> bool:
    return (isinstance(mlp, nn.Sequential) and len(mlp) == 3 and is_linear(mlp[0]) and _is_gelu_tanh(mlp[1])
            and is_linear(mlp[2]))


_DOUBLE_PARTS = {"img_mod", "img_norm1", "img_attn", "img_norm2", "img_mlp",
                 "txt_mod", "txt_norm1", "txt_attn", "txt_norm2", "txt_mlp"}
_SINGLE_PARTS = {"linear1", "linear2", "norm", "pre_norm", "mlp_act", "modulation"}


def _double_parts_problem(block, module: str, is_linear: Callable = _is_linear) -> str | None:
    if set(block._modules) != _DOUBLE_PARTS:
        return f"its parts {sorted(set(block._modules) ^ _DOUBLE_PARTS)} differ from the Flux block rocm_sd follows"
    if not all(_no_affine_layer_norm(getattr(block, f"{s}_norm{i}")) for s in ("img", "txt") for i in (1, 2)):
        return "its norms are not LayerNorms without affine parameters"
    if not all(_flux_qk_norm(getattr(block, f"{s}_attn").norm, module) and _flux_mlp(getattr(block, f"{s}_mlp"),
                                                                                     is_linear)
               and getattr(block, f"{s}_mod").is_double for s in ("img", "txt")):
        return "its Q / K norms, MLPs or modulations differ from Flux's"
    return None


def _single_parts_problem(block, module: str) -> str | None:
    if set(block._modules) != _SINGLE_PARTS:
        return f"its parts {sorted(set(block._modules) ^ _SINGLE_PARTS)} differ from the Flux block rocm_sd follows"
    # linear2 takes [attention, MLP]: a quantized Linear of Forge's may not say its in_features (its own forward runs)
    inputs = getattr(block.linear2, "in_features", block.hidden_size + block.mlp_hidden_dim)
    if not (_no_affine_layer_norm(block.pre_norm) and _is_gelu_tanh(block.mlp_act) and _flux_qk_norm(block.norm, module)
            and not block.modulation.is_double and inputs == block.hidden_size + block.mlp_hidden_dim):
        return "its norms, activation or projections differ from Flux's"
    return None


def _flux_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, L, H, D) views of a (B, L, 3 * H * D) projection, as Flux's view(B, L, 3, H, -1)."""
    return qkv.view(qkv.shape[0], qkv.shape[1], 3, heads, -1).unbind(2)


def _flux_normed(x, norm, pe, eps: float, lead=None, lead_norm=None) -> tuple[torch.Tensor, bool]:
    """(cat([lead_norm(lead), norm(x)], dim=1) rotated by pe where _rotary converts it, as one rocm_sd::rms_norm
    (B, L0 + L, H, D); whether it is rotated)."""
    rows = x.shape[1] + (0 if lead is None else lead.shape[1])
    rotary = _rotary(pe, rows) or (None, None)
    y = rms_norm.call(x, _cast(norm.scale, x), eps, lead, None if lead is None else _cast(lead_norm.scale, x), *rotary)
    return y, rotary[0] is not None


def _double_chain(port: _FluxPort, self, img, txt, vec, pe, txt_first: bool, mask=None, options=None):
    """DoubleStreamBlock.forward with the chains fused; (img, txt) out."""
    host_path = self.rocm_sd_host_path
    streams = {}
    normed = {}
    for name, x in (("img", img), ("txt", txt)):
        mod1, mod2 = port.modulations(getattr(self, f"{name}_mod"), vec)
        shift, scale, gate = mod1
        attn = getattr(self, f"{name}_attn")
        normed[name] = modulated(_rows(x), scale, shift, getattr(self, f"{name}_norm1").eps, [attn.qkv])
        streams[name] = (x, attn, None, gate, mod2)
    first, second = ("txt", "img") if txt_first else ("img", "txt")
    lead_attn, attn = streams[first][1], streams[second][1]
    (lead_q, q), (lead_k, k), v = _joint_heads(lead_attn, normed[first], attn, normed[second], self.num_heads,
                                               _host_plain(host_path))
    rope = port.rope(self, pe)
    q, rotated = _flux_normed(q, attn.norm.query_norm, rope, port.rms_eps(attn.norm.query_norm), lead_q,
                              lead_attn.norm.query_norm)
    k, _ = _flux_normed(k, attn.norm.key_norm, rope, port.rms_eps(attn.norm.key_norm), lead_k,
                        lead_attn.norm.key_norm)
    out = port.attention(self, q, k, v, pe, rotated, mask, options)
    split = streams[first][0].shape[1]
    outputs = {first: out[:, :split], second: out[:, split:]}
    for name in ("img", "txt"):
        x, attn, _, gate, (shift, scale, gate_mlp) = streams[name]
        mlp, norm2 = getattr(self, f"{name}_mlp"), getattr(self, f"{name}_norm2")
        h, n = add_modulated(_rows(x), linear_rows(attn.proj, outputs[name], _host_plain(host_path)), gate, scale,
                             shift, norm2.eps, [mlp[0]])
        streams[name] = gated(h, gate_mlp, _gelu_mlp(mlp[0], mlp[2], n, host_path))
    return streams["img"], port.clip(self, streams["txt"])


def _single_chain(port: _FluxPort, self, x, vec, pe, mask=None, options=None):
    """SingleStreamBlock.forward with the AdaLN and Q / K RMSNorm (+ rope) fused, linear1 as two GEMMs (qkv; the MLP's
    with its GELU) and linear2 of [attention, MLP] as two GEMMs into one output where the layers allow
    (_single_linear1, _single_linear2)."""
    (shift, scale, gate), = port.modulations(self.modulation, vec)
    normed = modulated(_rows(x), scale, shift, self.pre_norm.eps, [self.linear1])
    halves = _linear2_halves(self, normed)
    qkv, mlp = _single_linear1(self, normed, halves)
    q, k, v = _flux_heads(qkv, self.num_heads)
    rope = port.rope(self, pe)
    q, rotated = _flux_normed(q, self.norm.query_norm, rope, port.rms_eps(self.norm.query_norm))
    k, _ = _flux_normed(k, self.norm.key_norm, rope, port.rms_eps(self.norm.key_norm))
    attention = port.attention(self, q, k, v, pe, rotated, mask, options)
    return port.clip(self, gated(x, gate, _single_linear2(self, attention, mlp, halves)))


def _linear2_halves(self, like: torch.Tensor) -> list[EightBit] | None:
    """linear2's 8-bit GEMM as its two input blocks, [attention, MLP] (EightBit.input_block), where it runs that GEMM
    in this call (`like`: a tensor of the rows' dtype and device) and the blocks fit it; else None."""
    features = getattr(self.linear2, "in_features", None)
    if not isinstance(features, int):
        return None
    rows = torch.empty((), dtype=like.dtype, device=rows_device(like)).expand(*like.shape[:-1], features)
    way = eight_bit(_decided(self.linear2, rows), rows)
    halves = None if way is None else [way.input_block(0, self.hidden_size),
                                       way.input_block(self.hidden_size, features)]
    return None if halves is None or None in halves else halves


def _decided(layer: nn.Module, x: torch.Tensor) -> nn.Module:
    """`layer` with the first call's choice made for an input like x where it is an 8-bit copy waiting for it: the
    blocks run its GEMM themselves from the first call on, so every call multiplies the same operands."""
    if isinstance(layer, QuantizedHostCopy):
        layer.rocm_sd_decide(x)
    return layer


def _single_linear1(self, x: torch.Tensor, halves: list[EightBit] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(qkv, the MLP's GELU) of linear1 on the block's normed rows x: two GEMMs where linear1 runs its 8-bit GEMM (x
    quantized once for both; the GELU writing only linear2's rows of it where linear2's `halves` take them) or is plain
    (the MLP's bias and GELU in its GEMM's epilogue); else linear1, then the GELU of its MLP columns, as ComfyUI."""
    width = 3 * self.hidden_size
    way = eight_bit(_decided(self.linear1, x), x)
    blocks = None if way is None else [way.output_block(0, width), way.output_block(width, way.weight_q.shape[0])]
    if blocks is not None and None not in blocks:
        qkv, pre = forward_8bit_blocks(x, blocks)
        return qkv, gelu_for(pre, None if halves is None else halves[1])
    if plain_linear(self.linear1, x, self.rocm_sd_host_path):
        weight, bias = self.linear1.weight, self.linear1.bias
        mlp = addmm_gelu_tanh(x, weight[width:], None if bias is None else bias[width:])
        if mlp is not None:
            return F.linear(x, weight[:width], bias[:width]), mlp
    qkv, mlp = torch.split(self.linear1(x), [width, self.mlp_hidden_dim], dim=-1)
    return qkv, F.gelu(mlp, approximate="tanh")


def _single_linear2(self, attention: torch.Tensor, mlp: torch.Tensor, halves: list[EightBit] | None) -> torch.Tensor:
    """linear2 of cat([attention, mlp], -1): its 8-bit `halves` or, where linear2 is plain, its weight's column
    blocks, each a GEMM into one output (no concatenation written); else linear2 of the concatenation."""
    if halves is not None:
        return forward_8bit_parts([attention, mlp], halves)
    if plain_linear(self.linear2, attention, self.rocm_sd_host_path):
        return split_proj_out(self.linear2, attention, mlp).view(*attention.shape[:-1], -1)  # Forge's: no out_features
    return self.linear2(torch.cat((attention, mlp), 2))


def _last_chain(self, x, vec):
    """Flux's LastLayer: linear(modulate(norm_final(x), shift, scale))."""
    shift, scale = self.adaLN_modulation(vec).chunk(2, dim=1)
    return self.linear(ada_layer_norm.call(_rows(x), scale, shift, self.norm_final.eps))


def _final_problem(layer) -> str | None:
    if not _no_affine_layer_norm(layer.norm_final):
        return "its norm is not a LayerNorm without affine parameters"
    return None


# ComfyUI's port: comfy/ldm/flux/layers.py and math.py

_DOUBLE_FORWARD = ("self", "img", "txt", "vec", "pe", "attn_mask", "modulation_dims_img", "modulation_dims_txt",
                   "transformer_options")
_SINGLE_FORWARD = ("self", "x", "vec", "pe", "attn_mask", "modulation_dims", "transformer_options")
_ATTENTION = ("q", "k", "v", "pe", "mask", "transformer_options")


def _flux_version_problem(block, forward_arguments: tuple[str, ...]) -> str | None:
    if _signature(type(unpatched(block)).forward) != forward_arguments:
        return "its forward takes other arguments than the ComfyUI version rocm_sd follows"
    if _signature(getattr(_host_module(block), "attention", None))[:len(_ATTENTION)] != _ATTENTION:
        return "this ComfyUI's flux attention function takes other arguments"
    return None


def _double_block_problem(block) -> str | None:
    return _double_parts_problem(block, FLUX) or _flux_version_problem(block, _DOUBLE_FORWARD)


def _single_block_problem(block) -> str | None:
    return _single_parts_problem(block, FLUX) or _flux_version_problem(block, _SINGLE_FORWARD)


def _flux_attention(block, q, k, v, pe, rotated: bool, mask, options) -> torch.Tensor:
    """Flux's attention function of the block's ComfyUI (q, k, v as (B, H, L, D)), with pe where not applied yet."""
    attention = _host_module(block).attention
    return attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), pe=None if rotated else pe, mask=mask,
                     transformer_options=options)


def _clip_fp16(block, x: torch.Tensor) -> torch.Tensor:
    """Flux's blocks clamp fp16 streams (ComfyUI's nan_to_num)."""
    return torch.nan_to_num(x, nan=0.0, posinf=65504, neginf=-65504) if x.dtype == torch.float16 else x


COMFY_FLUX = _FluxPort(
    modulations=lambda modulation, vec: [_flux_chunks(m) for m in modulation(vec) if m is not None],
    rope=lambda block, pe: pe, attention=_flux_attention, clip=_clip_fp16, rms_eps=lambda norm: FLUX_RMS_EPS)


def _double_block(base: type, self, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None,
                  modulation_dims_txt=None, transformer_options={}, **kwargs):
    """ComfyUI's DoubleStreamBlock.forward with the chains fused; (img, txt) out, as ComfyUI's."""
    if (kwargs or modulation_dims_img is not None or modulation_dims_txt is not None
            or not isinstance(vec, torch.Tensor) or vec.dim() != 2 or _patched(transformer_options)):
        return base.forward(self, img, txt, vec, pe, attn_mask, modulation_dims_img, modulation_dims_txt,
                            transformer_options, **kwargs)
    return _double_chain(COMFY_FLUX, self, img, txt, vec, pe, not self.flipped_img_txt, attn_mask,
                         transformer_options)


def _single_block(base: type, self, x, vec, pe, attn_mask=None, modulation_dims=None, transformer_options={},
                  **kwargs):
    """ComfyUI's SingleStreamBlock.forward, fused (_single_chain)."""
    if (kwargs or modulation_dims is not None or not isinstance(vec, torch.Tensor) or vec.dim() != 2
            or _patched(transformer_options)):
        return base.forward(self, x, vec, pe, attn_mask, modulation_dims, transformer_options, **kwargs)
    return _single_chain(COMFY_FLUX, self, x, vec, pe, attn_mask, transformer_options)


def _last_layer(base: type, self, x, vec, modulation_dims=None):
    """ComfyUI's LastLayer."""
    if modulation_dims is not None or not isinstance(vec, torch.Tensor) or vec.dim() != 2:
        return base.forward(self, x, vec, modulation_dims)
    return _last_chain(self, x, vec)


# Forge's port: backend/nn/flux.py (lllyasviel/stable-diffusion-webui-forge, as at dfdcbab6; its blocks unchanged
# since b09c24ef). What differs from ComfyUI's, and how the chain takes it:
# - forward(img, txt, vec, pe) / (x, vec, pe) / (x, vec): no mask, transformer options or modulation_dims;
# - Modulation returns its 6 (or 3) chunks as a tuple of (B, 1, C) tensors, not ModulationOut pairs (same order);
# - txt always first in the joint attention (no flipped_img_txt);
# - the blocks call the module's attention(q, k, v, pe), which applies rope (apply_rope) and then calls
#   attention_function(q, k, v, heads, skip_reshape=True): with the rope applied by rocm_sd::rms_norm, the chain
#   calls attention_function itself (or rocm_sd's attention, the extension's attention option: rocm_sd_attention),
#   and it leaves rope and attention to attention() wherever another extension replaced that function;
# - fp16_fix (a clip to +-32768) instead of ComfyUI's nan_to_num, at the same places (txt, and the single stream);
# - RMSNorm keeps its eps (1e-6) as an attribute since 81d8f55b (before: fixed);
# - built under Forge's operations (backend/operations.py): its Linears are Forge's own modules, not nn.Linears
#   (they run their own forward: casts, offloading, online LoRA; plain_linear takes ForgeOperations.Linear where
#   none of that applies), its LayerNorms subclasses of nn.LayerNorm.

FORGE_FLUX = "backend.nn.flux"
_FORGE_FORWARDS = {"DoubleStreamBlock": ("self", "img", "txt", "vec", "pe"),
                   "SingleStreamBlock": ("self", "x", "vec", "pe"), "LastLayer": ("self", "x", "vec")}


def _forge_linear(module) -> bool:
    """A Linear of torch or of Forge's operations (ForgeOperations, its GGUF and bitsandbytes variants)."""
    return isinstance(module, nn.Linear) or (isinstance(module, nn.Module) and type(module).__name__ == "Linear"
                                             and type(module).__module__.startswith("backend."))


def _forge_version_problem(block) -> str | None:
    if _signature(type(unpatched(block)).forward) != _FORGE_FORWARDS[type(unpatched(block)).__name__]:
        return "its forward takes other arguments than the Forge version rocm_sd follows"
    host = _host_module(block)
    if (_signature(getattr(host, "attention", None))[:4] != ("q", "k", "v", "pe")
            or _signature(getattr(host, "apply_rope", None)) != ("xq", "xk", "freqs_cis")
            or not callable(getattr(host, "attention_function", None))):
        return "this Forge's flux attention functions take other arguments"
    return None


def _forge_double_problem(block) -> str | None:
    return _double_parts_problem(block, FORGE_FLUX, _forge_linear) or _forge_version_problem(block)


def _forge_single_problem(block) -> str | None:
    if not (_forge_linear(block.linear1) and _forge_linear(block.linear2)):
        return "its projections are not Linears"
    return _single_parts_problem(block, FORGE_FLUX) or _forge_version_problem(block)


def _forge_last_problem(layer) -> str | None:
    return _final_problem(layer) or _forge_version_problem(layer)


def _forge_own_attention(host) -> bool:
    """Whether backend.nn.flux's attention() is Forge's own (rope, then attention_function), not another
    extension's replacement."""
    return getattr(getattr(host, "attention", None), "__module__", None) == host.__name__


def _forge_modulations(modulation, vec) -> list:
    chunks = [c[:, 0] for c in modulation(vec)]
    return [tuple(chunks[i:i + 3]) for i in range(0, len(chunks), 3)]


def _forge_attention(block, q, k, v, pe, rotated: bool, mask, options) -> torch.Tensor:
    """What Forge's attention(q, k, v, pe) computes, q, k, v handed over (B, H, L, D) as its blocks do; rope applied
    here (Forge's apply_rope) where rocm_sd::rms_norm did not, and attention_function or the copy's
    rocm_sd_attention(attention_function, q, k, v, heads) called on the result."""
    host = _host_module(block)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if not _forge_own_attention(host):
        return host.attention(q, k, v, pe=pe)
    if not rotated and pe is not None:
        q, k = host.apply_rope(q, k, pe)
    chosen = block.rocm_sd_attention
    if chosen is None:
        return host.attention_function(q, k, v, q.shape[1], skip_reshape=True)
    return chosen(host.attention_function, q, k, v, q.shape[1])


def _forge_clip(block, x: torch.Tensor) -> torch.Tensor:
    fix = getattr(_host_module(block), "fp16_fix", None)  # Forge before b09c24ef did not clamp
    return x if fix is None else fix(x)


FORGE = _FluxPort(modulations=_forge_modulations,
                  rope=lambda block, pe: pe if _forge_own_attention(_host_module(block)) else None,
                  attention=_forge_attention, clip=_forge_clip,
                  rms_eps=lambda norm: getattr(norm, "eps", FLUX_RMS_EPS))


def _vector(vec) -> bool:
    return isinstance(vec, torch.Tensor) and vec.dim() == 2


def _forge_double_block(base: type, self, img, txt, vec, pe, *args, **kwargs):
    """Forge's DoubleStreamBlock.forward, fused (_double_chain); (img, txt) out, as Forge's."""
    if args or kwargs or not _vector(vec):
        return base.forward(self, img, txt, vec, pe, *args, **kwargs)
    return _double_chain(FORGE, self, img, txt, vec, pe, txt_first=True)


def _forge_single_block(base: type, self, x, vec, pe, *args, **kwargs):
    """Forge's SingleStreamBlock.forward, fused (_single_chain)."""
    if args or kwargs or not _vector(vec):
        return base.forward(self, x, vec, pe, *args, **kwargs)
    return _single_chain(FORGE, self, x, vec, pe)


def _forge_last_layer(base: type, self, x, vec, *args, **kwargs):
    """Forge's LastLayer."""
    if args or kwargs or not _vector(vec):
        return base.forward(self, x, vec, *args, **kwargs)
    return _last_chain(self, x, vec)


# (module, class name) -> (the fused forward, why a block of that class cannot take it)
BLOCKS = {(MMDIT, "JointBlock"): (_joint_block, _joint_block_problem),
          (MMDIT, "FinalLayer"): (_final_layer, _final_problem),
          (FLUX, "DoubleStreamBlock"): (_double_block, _double_block_problem),
          (FLUX, "SingleStreamBlock"): (_single_block, _single_block_problem),
          (FLUX, "LastLayer"): (_last_layer, _final_problem),
          (FORGE_FLUX, "DoubleStreamBlock"): (_forge_double_block, _forge_double_problem),
          (FORGE_FLUX, "SingleStreamBlock"): (_forge_single_block, _forge_single_problem),
          (FORGE_FLUX, "LastLayer"): (_forge_last_layer, _forge_last_problem)}


def block_kind(module) -> tuple[str, str] | None:
    """(module, class name) of one of ComfyUI's (or Forge's Flux) transformer blocks rocm_sd has a forward for, else
    None."""
    key = (type(module).__module__, type(module).__name__)
    return key if key in BLOCKS else None


def block_problem(block: nn.Module) -> str | None:
    """Why the block's structure does not take the fused forward (another configuration or host version), or None."""
    kind = block_kind(block)
    if kind is None:
        return f"{type(block).__name__} is not one of ComfyUI's SD3 / Flux blocks or Forge's Flux blocks"
    try:
        return BLOCKS[kind][1](block)
    except AttributeError as error:  # a part the fused forward reads is missing
        return f"it lacks a part rocm_sd reads ({error})"


def dit_block_copy(block: nn.Module, host_path: Callable[[nn.Module], bool] = _never,
                   attention: Callable | None = None) -> nn.Module:
    """`block` running its fused forward, unless the call is of another form (the module doc). `host_path(linear)`:
    whether the host casts or patches that Linear's weight per call (then it runs the Linear's own forward).
    `attention(host_function, q, k, v, heads)`: the attention of Forge's Flux blocks, which call their attention
    function themselves (None: Forge's own attention_function); ComfyUI's blocks call ComfyUI's, whose override
    the node sets."""
    block = unpatched(block)
    kind = block_kind(block)
    if kind is None:
        raise TypeError(f"expected one of ComfyUI's SD3 / Flux blocks or Forge's Flux blocks, got "
                        f"{type(block).__name__}")
    base, fused = type(block), BLOCKS[kind][0]

    def forward(self, *args, **kwargs):
        return fused(base, self, *args, **kwargs)

    new = host_face(block, face_class(base, "dit", forward, slots=("rocm_sd_host_path", "rocm_sd_attention")))
    new.rocm_sd_host_path, new.rocm_sd_attention = host_path, attention
    return new
