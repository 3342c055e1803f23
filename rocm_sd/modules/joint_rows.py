"""The joint sequence's rows, written and read where they lie.

The diffusion transformers' joint attention takes one sequence per image, the image stream's rows and the text
stream's side by side ([image, text] in SD3, [text, image] in Flux), and gives back one such sequence. Eager code
concatenates the two streams' projections into it (a copy of Q, K and V) and reshapes each stream's part of the output
into the rows its output projection reads (another copy). Here

- `joint_linear` runs each stream's projection (its V, or the fused QKV) as GEMMs that write its rows into the joint
  buffer, so nothing concatenates them;
- `joint_qkv` does so for the two streams' fused QKV projections where one of them can, and otherwise joins only V
  (Q and K stay the streams' own: the Q / K norm reads them where they lie and writes the joint sequence);
- `linear_rows` runs an output projection on its stream's part of the attention output (a (B, L, K) view whose batches
  each are L contiguous rows) as GEMMs that read those rows in place.

A GEMM's rows must be one matrix with one row stride, and a stream's rows in the joint buffer are one per batch: so
there is one GEMM per batch (the CFG batch of 2 in SD3.5, 1 in Flux). Layers these cannot run (a LoRA layer, a hooked
or host-patched one, gradients, torch.compile tracing) run their own forward, and the result is copied.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .fusing import called_plainly
from .quantized_linear import EightBit, eight_bit, forward_8bit_into

Plain = Callable[[nn.Module, torch.Tensor], bool]


def plain_torch_linear(layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether `layer` computes x @ weight.T + bias with the weight and bias it holds: diffusers' own nn.Linear."""
    return (type(layer) is nn.Linear and called_plainly(layer)
            and all(t is None or (t.dtype == x.dtype and t.device == x.device) for t in (layer.weight, layer.bias)))


def _batches_of_rows(x: torch.Tensor) -> bool:
    """A (B, L, K) tensor whose batches each are L contiguous rows: a batch is one matrix with one row stride."""
    return x.dim() == 3 and x.stride(2) == 1 and (x.shape[1] <= 1 or x.stride(1) == x.shape[2])


def _gemm_batches(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """out[b] = x[b] @ weight.T + bias for each batch b, each a GEMM reading and writing its rows in place (the bias in
    the GEMM's epilogue)."""
    w_t = weight.t()
    for b in range(x.shape[0]):
        if bias is None:
            torch.mm(x[b], w_t, out=out[b])
        else:
            torch.addmm(bias, x[b], w_t, out=out[b])


Way = str | EightBit | None  # how a layer runs on rows in place: "16-bit", its 8-bit GEMM's operands, or None


def _runs_in_place(layer: nn.Module, x: torch.Tensor, plain: Plain) -> Way:
    """How `layer` can run on x's rows in place: "16-bit" (a plain Linear), the operands of its 8-bit GEMM (an 8-bit
    layer running it: quantized_linear.eight_bit), else None (its own forward)."""
    if torch.compiler.is_compiling() or torch.is_grad_enabled():  # out= GEMMs have no autograd
        return None
    way = eight_bit(layer, x)
    if way is not None:
        return way
    return "16-bit" if not x.is_meta and _batches_of_rows(x) and plain(layer, x) else None


def _write(layer: nn.Module, x: torch.Tensor, out: torch.Tensor, way: Way) -> None:
    if way == "16-bit":
        _gemm_batches(x, layer.weight, layer.bias, out)
    else:
        forward_8bit_into(x, way.in_features, way.weight_q, way.weight_scale, way.bias, way.format, out)


def _weight(layer: nn.Module, way: Way) -> torch.Tensor:
    """The weight the layer's GEMM reads: its out features and device are the output's (Forge's older Linears lack
    out_features; x may be an 8-bit producer's stand-in, on meta)."""
    return layer.weight if way == "16-bit" else way.weight_q


def _parts(first: nn.Module, first_x: torch.Tensor, second: nn.Module, second_x: torch.Tensor,
           plain: Plain) -> list[tuple[nn.Module, torch.Tensor, Way]]:
    return [(first, first_x, _runs_in_place(first, first_x, plain)),
            (second, second_x, _runs_in_place(second, second_x, plain))]


def _joint_linear(parts: list[tuple[nn.Module, torch.Tensor, Way]]) -> torch.Tensor:
    """joint_linear of parts [(layer, x, way)] whose ways _runs_in_place decided, one of them not None."""
    layer, x, way = next(part for part in parts if part[2] is not None)
    weight = _weight(layer, way)
    joint = torch.empty(x.shape[0], sum(x.shape[1] for _, x, _ in parts), weight.shape[0], dtype=x.dtype,
                        device=weight.device)
    start = 0
    for layer, x, way in parts:
        rows = joint[:, start:start + x.shape[1]]
        if way is None:
            rows.copy_(layer(x))
        else:
            _write(layer, x, rows, way)
        start += x.shape[1]
    return joint


def joint_linear(first: nn.Module, first_x: torch.Tensor, second: nn.Module, second_x: torch.Tensor,
                 plain: Plain = plain_torch_linear) -> torch.Tensor:
    """torch.cat([first(first_x), second(second_x)], dim=1) for (B, L, K) inputs, each projection writing its rows
    into the joint (B, L1 + L2, N) tensor. `plain`: whether a layer may be run as the GEMM of its weight and bias."""
    parts = _parts(first, first_x, second, second_x, plain)
    if all(way is None for *_, way in parts):
        return torch.cat([first(first_x), second(second_x)], dim=1)
    return _joint_linear(parts)


def joined(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """torch.cat([first, second], dim=1). Views of a fused QKV projection (a row stride of 3 * C) are copied into one
    buffer by two strided copies: PyTorch's cat takes its slow gather path for such views
    (bench/results/notes/2026-12-02-dit-fp8-fusions-h200.md)."""
    if first.is_contiguous() and second.is_contiguous() or first.dtype != second.dtype:
        return torch.cat([first, second], dim=1)
    out = first.new_empty(first.shape[0], first.shape[1] + second.shape[1], *first.shape[2:])
    out[:, :first.shape[1]].copy_(first)
    out[:, first.shape[1]:].copy_(second)
    return out


def joint_qkv(first: nn.Module, first_x: torch.Tensor, second: nn.Module, second_x: torch.Tensor,
              plain: Plain = plain_torch_linear):
    """((Q of first, Q of second), (K of first, K of second), V of both joined), (B, L, C) each, of two streams' fused
    QKV projections ([q | k | v] along the last dimension): all three written into one joint tensor where a projection
    can run in place, else V alone joined (a copy of one third of what torch.cat of the whole would move)."""
    parts = _parts(first, first_x, second, second_x, plain)
    if any(way is not None for *_, way in parts):
        query, key, value = _joint_linear(parts).chunk(3, dim=-1)
        split = first_x.shape[1]
        return (query[:, :split], query[:, split:]), (key[:, :split], key[:, split:]), value
    (first_q, first_k, first_v), (second_q, second_k, second_v) = (
        layer(x).chunk(3, dim=-1) for layer, x in ((first, first_x), (second, second_x)))
    return (first_q, second_q), (first_k, second_k), joined(first_v, second_v)


def linear_rows(layer: nn.Module, x: torch.Tensor, plain: Plain = plain_torch_linear) -> torch.Tensor:
    """layer(x) for x a (B, L, K) view whose batches are contiguous rows (a stream's part of the joint attention
    output), read in place by a GEMM a batch where the layer is a plain Linear; otherwise the layer's own forward
    (an 8-bit layer reads such rows in place itself)."""
    if x.is_contiguous() or _runs_in_place(layer, x, plain) != "16-bit":
        return layer(x)
    out = torch.empty(*x.shape[:-1], layer.out_features, dtype=x.dtype, device=x.device)
    _gemm_batches(x, layer.weight, layer.bias, out)
    return out
