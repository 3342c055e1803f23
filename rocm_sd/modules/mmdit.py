"""The fused forwards of the diffusion transformers' blocks (SD3 / SD3.5 MMDiT, Flux) and their GELU projection.

An MMDiT block spends four tenths of its device time on memory-bound steps around its GEMMs and attention: the
AdaLN-Zero modulation around each LayerNorm (`norm(x) * (1 + scale) + shift`), the gated residuals
(`x + gate * y`), the concatenations of the text and image streams. Here each block's chain is
    ada_layer_norm (norm1, both streams) -> attention -> add_ada_layer_norm (gated residual + norm2) -> feed-forward
    -> addcmul (gated residual)
instead of about ten elementwise kernels per stream. The modulation vectors are strided views of the block's
embedding chunks, read as they are. Same math as diffusers' forwards, op for op; the fused steps round once. With
8-bit projections (precision="fp8" / "int8") the norms and GELUs in front of them write those projections' 8-bit rows
instead of their outputs where they can (modules/mmdit_8bit.py).

Each forward here replaces diffusers' only on the exact block classes whose structure `fusable` checks, and
hands calls it does not cover (joint_attention_kwargs, IP-Adapter outputs, feed-forward chunking) to the
original forward.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from .. import platform
from ..ops.ada_layer_norm import ada_layer_norm
from ..ops.gelu_tanh import gelu_tanh
from .layer_norm import RocmLayerNorm
from .mmdit_8bit import add_modulated, attention_consumers, feed_forward, feed_forward_consumers, mlp_gelu, modulated
from .quantized_linear import RocmQuantizedLinear, RocmQuantizedSplitLinear

def _is_plain_layer_norm(norm) -> bool:
    """A LayerNorm over the last dimension without weight or bias (or the layer_norm flag's copy of one)."""
    return (type(norm) in (nn.LayerNorm, RocmLayerNorm) and len(norm.normalized_shape) == 1 and norm.weight is None
            and norm.bias is None)


def _is_ada_zero(norm) -> bool:
    """diffusers' AdaLayerNormZero / SD35AdaLayerNormZeroX / AdaLayerNormZeroSingle without their own timestep
    embedding, over a plain non-affine LayerNorm."""
    return (type(norm).__name__ in ("AdaLayerNormZero", "SD35AdaLayerNormZeroX", "AdaLayerNormZeroSingle")
            and getattr(norm, "emb", None) is None and _is_plain_layer_norm(getattr(norm, "norm", None)))


def _is_ada_continuous(norm) -> bool:
    return type(norm).__name__ == "AdaLayerNormContinuous" and _is_plain_layer_norm(getattr(norm, "norm", None))


def _modulation(norm, temb: torch.Tensor, chunks: int) -> tuple[torch.Tensor, ...]:
    """The block's AdaLN embedding, `chunks` strided (B, C) views of it, in diffusers' order."""
    return norm.linear(norm.silu(temb)).chunk(chunks, dim=1)


def gated(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + gate[:, None] * y in one pass (the product is not rounded on its own)."""
    return torch.addcmul(x, gate.unsqueeze(1), y)


def _continuous(norm, x: torch.Tensor, conditioning: torch.Tensor) -> torch.Tensor:
    """AdaLayerNormContinuous: scale first, then shift (the other order from AdaLayerNormZero's)."""
    scale, shift = norm.linear(norm.silu(conditioning).to(x.dtype)).chunk(2, dim=1)
    return ada_layer_norm.call(x, scale, shift, norm.norm.eps)


# ---- SD3 / SD3.5: JointTransformerBlock ------------------------------------------------------------------------

def joint_block_fusable(block: nn.Module) -> bool:
    context = block.norm1_context
    return (_is_ada_zero(block.norm1) and _is_plain_layer_norm(block.norm2)
            and (_is_ada_continuous(context) if block.context_pre_only else
                 _is_ada_zero(context) and _is_plain_layer_norm(block.norm2_context)))


def joint_block_forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, temb: torch.Tensor,
                        joint_attention_kwargs=None):
    """JointTransformerBlock.forward (diffusers/models/attention.py) with the AdaLN chains fused."""
    if joint_attention_kwargs or self._chunk_size is not None:
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, joint_attention_kwargs)
    eps = self.norm1.norm.eps
    if self.use_dual_attention:
        (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_msa2, scale_msa2,
         gate_msa2) = _modulation(self.norm1, temb, 9)
        norm_hidden_states2 = modulated(hidden_states, scale_msa2, shift_msa2, eps, attention_consumers(self.attn2))
    else:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = _modulation(self.norm1, temb, 6)
    norm_hidden_states = modulated(hidden_states, scale_msa, shift_msa, eps, attention_consumers(self.attn))
    if self.context_pre_only:
        norm_encoder_hidden_states = _continuous(self.norm1_context, encoder_hidden_states, temb)
    else:
        c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = _modulation(
            self.norm1_context, temb, 6)
        norm_encoder_hidden_states = modulated(encoder_hidden_states, c_scale_msa, c_shift_msa,
                                               self.norm1_context.norm.eps, attention_consumers(self.attn, True))

    attn_output, context_attn_output = self.attn(hidden_states=norm_hidden_states,
                                                 encoder_hidden_states=norm_encoder_hidden_states)
    if self.use_dual_attention:
        hidden_states = gated(hidden_states, gate_msa, attn_output)
        attn_output, gate_msa = self.attn2(hidden_states=norm_hidden_states2), gate_msa2
    ff_rows = feed_forward_consumers(self.ff)
    hidden_states, norm_hidden_states = add_modulated(hidden_states, attn_output, gate_msa, scale_mlp, shift_mlp,
                                                      self.norm2.eps, ff_rows)
    hidden_states = gated(hidden_states, gate_mlp, feed_forward(self.ff, norm_hidden_states, ff_rows))

    if self.context_pre_only:
        return None, hidden_states
    context_ff_rows = feed_forward_consumers(self.ff_context)
    encoder_hidden_states, norm_encoder_hidden_states = add_modulated(
        encoder_hidden_states, context_attn_output, c_gate_msa, c_scale_mlp, c_shift_mlp, self.norm2_context.eps,
        context_ff_rows)
    encoder_hidden_states = gated(encoder_hidden_states, c_gate_mlp,
                                  feed_forward(self.ff_context, norm_encoder_hidden_states, context_ff_rows))
    return encoder_hidden_states, hidden_states


# ---- Flux: FluxTransformerBlock (double stream) and FluxSingleTransformerBlock ---------------------------------

def flux_block_fusable(block: nn.Module) -> bool:
    return (_is_ada_zero(block.norm1) and _is_ada_zero(block.norm1_context) and _is_plain_layer_norm(block.norm2)
            and _is_plain_layer_norm(block.norm2_context))


def _clip_fp16(x: torch.Tensor) -> torch.Tensor:
    return x.clip(-65504, 65504) if x.dtype == torch.float16 else x


def flux_block_forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, temb: torch.Tensor,
                       image_rotary_emb=None, joint_attention_kwargs=None):
    """FluxTransformerBlock.forward (diffusers/models/transformers/transformer_flux.py) with the AdaLN chains
    fused. Returns (encoder_hidden_states, hidden_states) as diffusers does."""
    if joint_attention_kwargs:
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                               joint_attention_kwargs)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = _modulation(self.norm1, temb, 6)
    c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = _modulation(
        self.norm1_context, temb, 6)
    norm_hidden_states = modulated(hidden_states, scale_msa, shift_msa, self.norm1.norm.eps,
                                   attention_consumers(self.attn, rotary=image_rotary_emb))
    norm_encoder_hidden_states = modulated(encoder_hidden_states, c_scale_msa, c_shift_msa,
                                           self.norm1_context.norm.eps,
                                           attention_consumers(self.attn, True, image_rotary_emb))
    attn_output, context_attn_output = self.attn(hidden_states=norm_hidden_states,
                                                 encoder_hidden_states=norm_encoder_hidden_states,
                                                 image_rotary_emb=image_rotary_emb)

    ff_rows = feed_forward_consumers(self.ff)
    hidden_states, norm_hidden_states = add_modulated(hidden_states, attn_output, gate_msa, scale_mlp, shift_mlp,
                                                      self.norm2.eps, ff_rows)
    hidden_states = gated(hidden_states, gate_mlp, feed_forward(self.ff, norm_hidden_states, ff_rows))

    context_ff_rows = feed_forward_consumers(self.ff_context)
    encoder_hidden_states, norm_encoder_hidden_states = add_modulated(
        encoder_hidden_states, context_attn_output, c_gate_msa, c_scale_mlp, c_shift_mlp, self.norm2_context.eps,
        context_ff_rows)
    encoder_hidden_states = gated(encoder_hidden_states, c_gate_mlp,
                                  feed_forward(self.ff_context, norm_encoder_hidden_states, context_ff_rows))
    return _clip_fp16(encoder_hidden_states), hidden_states


def flux_single_block_fusable(block: nn.Module) -> bool:
    return (_is_ada_zero(block.norm) and type(block.proj_mlp) is nn.Linear and type(block.proj_out) is nn.Linear
            and isinstance(block.act_mlp, nn.GELU) and block.act_mlp.approximate == "tanh"
            and block.proj_out.in_features == block.proj_mlp.in_features + block.proj_mlp.out_features)


def _joined(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """torch.cat([first, second], dim=1), or the view both already are: the previous single block returned its
    output's two halves, which lie side by side in one tensor when the batch is 1."""
    joint_length = first.shape[1] + second.shape[1]
    if (not torch.compiler.is_compiling() and first.shape[0] == 1 and first.is_contiguous() and second.is_contiguous() and first.dtype == second.dtype
            and first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
            and second.data_ptr() == first.data_ptr() + first.numel() * first.element_size()):
        return first.as_strided((1, joint_length, first.shape[2]), (joint_length * first.shape[2], first.shape[2], 1))
    return torch.cat([first, second], dim=1)


def flux_single_block_forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                              temb: torch.Tensor, image_rotary_emb=None, joint_attention_kwargs=None):
    """FluxSingleTransformerBlock.forward with the AdaLN fused, the MLP's bias and GELU in its GEMM's epilogue, and
    proj_out applied to the attention and MLP outputs as two GEMMs into one output instead of over their
    concatenation."""
    if (joint_attention_kwargs or type(self.proj_out) not in (nn.Linear, RocmQuantizedSplitLinear)
            or type(self.proj_mlp) not in (nn.Linear, RocmQuantizedLinear)):
        # a LoRA layer installed since: its own forwards (the split proj_out reads the base weight only)
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                               joint_attention_kwargs)
    text_seq_len = encoder_hidden_states.shape[1]
    residual = _joined(encoder_hidden_states, hidden_states)
    shift, scale, gate = _modulation(self.norm, temb, 3)
    consumers = attention_consumers(self.attn, rotary=image_rotary_emb)
    norm_hidden_states = modulated(residual, scale, shift, self.norm.norm.eps,
                                   consumers and consumers + [self.proj_mlp])
    second_half = self.proj_out.second if type(self.proj_out) is RocmQuantizedSplitLinear else None
    mlp_hidden_states = mlp_gelu(self.proj_mlp, norm_hidden_states, second_half)
    if mlp_hidden_states is None:
        mlp_hidden_states = linear_gelu_tanh(self.proj_mlp, norm_hidden_states)
    attn_output = self.attn(hidden_states=norm_hidden_states, image_rotary_emb=image_rotary_emb)

    hidden_states = _clip_fp16(gated(residual, gate, split_proj_out(self.proj_out, attn_output,
                                                                    mlp_hidden_states).view(residual.shape)))
    return hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]


def split_proj_out(proj_out: nn.Module, attn_output: torch.Tensor, mlp_hidden_states: torch.Tensor) -> torch.Tensor:
    """proj_out of cat([attn_output, mlp_hidden_states], -1) as two GEMMs into one output, as (rows, out) or
    (..., out): a Linear's over its weight's column blocks, an 8-bit one's (precision="fp8" / "int8") by its halves."""
    if type(proj_out) is RocmQuantizedSplitLinear:
        return proj_out.forward_parts(attn_output, mlp_hidden_states)
    width = attn_output.shape[-1]
    weight = proj_out.weight
    rows = attn_output.reshape(-1, width)
    projected = torch.addmm(proj_out.bias, rows, weight[:, :width].t()) if proj_out.bias is not None \
        else rows @ weight[:, :width].t()
    return projected.addmm_(mlp_hidden_states.reshape(-1, mlp_hidden_states.shape[-1]), weight[:, width:].t())


# ---- the feed-forward's projection + GELU(tanh) ----------------------------------------------------------------

def linear_gelu_tanh(linear: nn.Linear, x: torch.Tensor, plain: bool | None = None) -> torch.Tensor:
    """gelu(linear(x), approximate="tanh") as addmm_gelu_tanh runs it (the bias and GELU in the vendor GEMM's
    epilogue where PyTorch has it there, else in rocm_sd::gelu_tanh after the GEMM); off a GPU, without a bias, or for
    any layer but a plain Linear (an 8-bit layer, a LoRA layer: its own forward), as two steps: the layer, then
    rocm_sd::gelu_tanh.
    `plain`: whether `linear` computes x @ weight.T + bias with the weight and bias it holds (default: it is an
    nn.Linear itself; a host's Linear subclass is plain where the host does not cast or patch its weights per call)."""
    if plain is None:
        plain = type(linear) is nn.Linear
    out = addmm_gelu_tanh(x, linear.weight, linear.bias) if plain else None
    return gelu_tanh.call(linear(x), None) if out is None else out


def addmm_gelu_tanh(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """gelu(x @ weight.T + bias, approximate="tanh"), (..., N), with no pass over the GEMM's output but one: the bias
    and GELU in the vendor GEMM's epilogue (torch._addmm_activation) where PyTorch runs it there
    (vendor_gelu_epilogue), else the GEMM without the bias, then rocm_sd::gelu_tanh adding it. None without a bias,
    off a GPU or where gradients flow."""
    if bias is None or x.device.type != "cuda" or torch.is_grad_enabled() and x.requires_grad:
        return None
    rows = x.reshape(-1, x.shape[-1])
    if vendor_gelu_epilogue(x.device):
        out = torch._addmm_activation(bias, rows, weight.t(), use_gelu=True)
    else:
        out = gelu_tanh.call(rows @ weight.t(), bias)
    return out.view(*x.shape[:-1], weight.shape[0])


# Where PyTorch sends addmm to hipBLASLt (aten/src/ATen/native/cuda/Blas.cpp): on the CDNA GPUs. On RDNA it runs the
# GEMM without the epilogue (pytorch#174350: its unfused path is faster there; older versions do not list the RDNA
# architectures at all), writing the bias into the output before the GEMM and the GELU as a pass of its own after.
_HIPBLASLT_ADDMM = ("gfx90a", "gfx942", "gfx950")


@functools.lru_cache(maxsize=None)
def vendor_gelu_epilogue(device: torch.device) -> bool:
    """Whether torch._addmm_activation applies the bias and GELU inside the vendor GEMM on `device`: cuBLASLt on
    NVIDIA; hipBLASLt on AMD's CDNA GPUs only (_HIPBLASLT_ADDMM). A rule read from PyTorch's source, not measured on
    an AMD GPU. Asked once per device: every feed-forward of every step asks it."""
    return platform.torch_gpu_platform() == "cuda" or platform.device_arch(device) in _HIPBLASLT_ADDMM


class RocmGELU(nn.Module):
    """diffusers' GELU activation module (proj, then GELU) with approximate="tanh", as linear_gelu_tanh. Shares
    the replaced module's `proj`, so weights and LoRA layers stay where diffusers has them."""

    def __init__(self, gelu: nn.Module):
        super().__init__()
        self.proj = gelu.proj
        self.approximate = gelu.approximate

    @classmethod
    def from_gelu(cls, gelu: nn.Module) -> "RocmGELU":
        return cls(gelu)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return linear_gelu_tanh(self.proj, hidden_states)  # a LoRA or 8-bit layer installed since: its own forward
