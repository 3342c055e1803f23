"""The diffusion transformers' fused block forwards (modules/mmdit.py) under optimize(precision="fp8" / "int8"): the
kernels in front of the 8-bit projections write those projections' 8-bit rows instead of their own output.

- An AdaLN (ada_layer_norm / add_ada_layer_norm) whose every consumer is an 8-bit projection that multiplies its
  producer's rows for good (quantized_linear.takes_rows_for_good) writes only the rows
  (ops/ada_layer_norm_quantized.py); the consumers find them on a stand-in (quantized_linear.rows_stand_in), which
  fails loudly if anything else reads it. The consumers of a norm in front of attention are the projections of its
  input (to_q / to_k / to_v or fuse_qkv's to_qkv, and for the text stream add_*_proj or to_added_qkv), which is all
  rocm_sd's joint processors read of it (modules/joint_attention.py); a single block's norm also feeds proj_mlp.
- The feed-forward's GELU(tanh) after its 8-bit projection writes only its output projection's rows
  (ops/gelu_tanh.py's gelu_tanh_quantized), and a single block's MLP GELU only proj_out's second half's.

ComfyUI's blocks (modules/comfy_dit.py) take the same producers in front of its layers copied as 8-bit ones
(QuantizedHostCopy): each norm1 in front of its stream's qkv (a Flux single block's in front of linear1), each norm2
in front of fc1, each MLP's GELU in front of fc2 (mlp_gelu). The host decides per call whether such a copy runs
its GEMM (weights it offloads or patches per call), so there the condition is checked per call.

Wherever a condition does not hold (a layer measured faster in 16 bits, a LoRA layer or hook installed since, another
processor, an extra argument, torch.compile tracing) the call takes the plain path: the norm's output, then
quantize_rows in each consumer. Both paths give the projections the same operands bit for bit.
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops.ada_layer_norm import ada_layer_norm, add_ada_layer_norm
from ..ops.ada_layer_norm_quantized import ada_layer_norm_quantized, add_ada_layer_norm_quantized
from ..ops.gelu_tanh import gelu_tanh, gelu_tanh_quantized
from .fusing import called_plainly
from .joint_attention import RocmFluxAttnProcessor, RocmJointAttnProcessor, _rotary_pair
from .quantized_linear import EightBit, eight_bit, rows_stand_in, takes_rows_for_good


def producers_write_rows(x: torch.Tensor | None = None) -> bool:
    """Whether a producer may write its 8-bit consumers' rows instead of its output (x: that output, or a tensor of its
    dtype): not while torch.compile traces, and only 16-bit rows (the producers' kernels quantize no others)."""
    return not torch.compiler.is_compiling() and (x is None or x.dtype in (torch.float16, torch.bfloat16))


def rows_format(consumers: list[nn.Module] | None, x: torch.Tensor | None = None) -> str | None:
    """The 8-bit format every one of `consumers` multiplies its producer's rows in for good, else None. With x (what
    the producer writes, or a tensor of its shape, dtype and device), a host's 8-bit copies count as well, for this
    call (quantized_linear.takes_rows_for_good), and only 16-bit rows are taken: the producers' kernels quantize no
    others."""
    if not consumers or not producers_write_rows(x):
        return None
    first = eight_bit(consumers[0], x)
    return first.format if first is not None and takes_rows_for_good(consumers[1:], first.format, x) else None


def attention_consumers(attn: nn.Module, context: bool = False, rotary=None) -> list[nn.Module] | None:
    """The layers of attention module `attn` that read its hidden_states (`context`: its encoder_hidden_states), when
    rocm_sd's joint processor takes the call and they are all it reads of that input; else None."""
    processor = getattr(attn, "processor", None)
    if type(processor) not in (RocmJointAttnProcessor, RocmFluxAttnProcessor) or not called_plainly(attn):
        return None
    if rotary is not None and not _rotary_pair(rotary):  # the Flux processor hands such calls to diffusers'
        return None
    fused = getattr(attn, "fused_projections", False)
    if context:
        names = ("to_added_qkv",) if fused and hasattr(attn, "to_added_qkv") else (
            "add_q_proj", "add_k_proj", "add_v_proj")
    else:
        names = ("to_qkv",) if fused else ("to_q", "to_k", "to_v")
    layers = [getattr(attn, name, None) for name in names]
    return layers if all(layer is not None for layer in layers) else None


def feed_forward_consumers(ff: nn.Module) -> list[nn.Module] | None:
    """[the GELU's projection] of a diffusers FeedForward (GELU(tanh), Dropout, Linear) that feed_forward can run as
    8-bit rows end to end, else None."""
    net = getattr(ff, "net", None)
    if (net is None or len(net) != 3 or not called_plainly(ff) or type(net[1]) is not nn.Dropout
            or (net[1].training and net[1].p > 0) or getattr(net[0], "approximate", None) != "tanh"
            or not all(called_plainly(m) for m in net)):
        return None
    proj = getattr(net[0], "proj", None)
    return [proj] if rows_format([net[2]]) is not None and rows_format([proj]) == net[2].format else None


def modulated(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float,
              consumers: list[nn.Module] | None) -> torch.Tensor:
    """ada_layer_norm(x, scale, shift), or the stand-in of its 8-bit rows where `consumers` take only those."""
    fmt = rows_format(consumers, x)
    if fmt is None:
        return ada_layer_norm.call(x, scale, shift, eps)
    q, row_scale = ada_layer_norm_quantized.call(x, scale, shift, eps, fmt)
    return rows_stand_in(x.shape, x.dtype, fmt, q, row_scale)


def add_modulated(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                  eps: float, consumers: list[nn.Module] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """add_ada_layer_norm(x, y, gate, scale, shift): (h, n), n as the stand-in of its 8-bit rows where `consumers` take
    only those."""
    fmt = rows_format(consumers, x)
    if fmt is None:
        return add_ada_layer_norm.call(x, y, gate, scale, shift, eps)
    h, q, row_scale = add_ada_layer_norm_quantized.call(x, y, gate, scale, shift, eps, fmt)
    return h, rows_stand_in(h.shape, h.dtype, fmt, q, row_scale)


def feed_forward(ff: nn.Module, x: torch.Tensor, consumers: list[nn.Module] | None) -> torch.Tensor:
    """ff(x); for an 8-bit FeedForward (`consumers`: its feed_forward_consumers, found once for the norm in front and
    this call), the GELU writing only its output projection's rows."""
    if consumers is None:
        return ff(x)
    net = ff.net
    q, row_scale = gelu_tanh_quantized.call(net[0].proj(x), None, net[2].format)
    return net[2].multiply_rows(q, row_scale, x.dtype)


def gelu_for(pre: torch.Tensor, consumer: EightBit | None) -> torch.Tensor:
    """gelu(pre, approximate="tanh") for `consumer`, the GEMM that multiplies it in this call where it is 8-bit (a
    layer's eight_bit, or a block of its input: EightBit.input_block): the stand-in of only its rows where producers
    write them, else the GELU's output."""
    if consumer is None or not producers_write_rows(pre):
        return gelu_tanh.call(pre, None)
    q, row_scale = gelu_tanh_quantized.call(pre, None, consumer.format)
    return rows_stand_in(pre.shape, pre.dtype, consumer.format, q, row_scale)


def mlp_gelu(proj: nn.Module, x: torch.Tensor, consumer: nn.Module | None) -> torch.Tensor | None:
    """gelu(proj(x), approximate="tanh") where proj runs its 8-bit GEMM: as the stand-in of its 8-bit rows where
    `consumer` (the layer taking the GELU's output: a split proj_out's second half, a host MLP's fc2) multiplies them
    in this call, else the GELU's output. None where proj does not run its 8-bit GEMM (the caller's path: a 16-bit proj
    takes the GELU in its GEMM's epilogue)."""
    if rows_format([proj], x) is None:
        return None
    pre = proj(x)
    fmt = rows_format([consumer], pre) if consumer is not None else None
    if fmt is None:
        return gelu_tanh.call(pre, None)
    q, row_scale = gelu_tanh_quantized.call(pre, None, fmt)
    return rows_stand_in(pre.shape, pre.dtype, fmt, q, row_scale)
