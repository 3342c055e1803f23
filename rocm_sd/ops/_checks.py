"""Argument checks every op makes before anything runs, in its real and its fake (meta) implementation.

What PyTorch's own op would refuse is refused the same way: a RuntimeError naming the op and the argument.
Everything accepted is described exactly by the op's fake kernel (shape, dtype, layout), so a graph traced by
torch.compile computes what eager does. The real ops check once per argument shape (inside their plan cache),
so the checks cost nothing on the hot path.
"""
from __future__ import annotations

import torch

REDUCED_FLOATS = (torch.float16, torch.bfloat16)


def fail(op: str, message: str):
    raise RuntimeError(f"rocm_sd::{op}: {message}")


def check_floating(op: str, **tensors: torch.Tensor | None) -> None:
    """Each given tensor has a floating-point dtype (PyTorch's norms and activations refuse integers and bools)."""
    for name, t in tensors.items():
        if t is not None and not t.is_floating_point():
            fail(op, f"{name} dtype {t.dtype} is not a floating-point type")


def check_same_device(op: str, x: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    """Each given tensor is on x's device (a weight left on the meta device by an offload hook, say)."""
    for name, t in tensors.items():
        if t is not None and t.device != x.device:
            fail(op, f"{name} is on {t.device}, the input on {x.device}: expected all tensors on one device")


def check_min_dims(op: str, x: torch.Tensor, dims: int, layout: str) -> None:
    if x.dim() < dims:
        fail(op, f"input of shape {tuple(x.shape)} has {x.dim()} dims, expected {layout}")


def check_norm_params(op: str, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      channels: int, dtype: torch.dtype | None = None) -> None:
    """PyTorch's rule for normalisation parameters: (channels,) vectors of the normalised dtype (x's unless
    `dtype` says), or float32 with a float16 / bfloat16 one (mixed precision), both of one dtype."""
    check_floating(op, weight=weight, bias=bias)
    check_same_device(op, x, weight=weight, bias=bias)
    dtype = dtype or x.dtype
    allowed = (dtype, torch.float32) if dtype in REDUCED_FLOATS else (dtype,)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if tuple(p.shape) != (channels,):
            fail(op, f"{name} of shape {tuple(p.shape)} is not a ({channels},) vector")
        if p.dtype not in allowed:
            fail(op, f"{name} dtype {p.dtype} does not go with input dtype {dtype} (the same dtype, or float32 with "
                     "a float16 / bfloat16 input)")
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        fail(op, f"weight dtype {weight.dtype} differs from bias dtype {bias.dtype}")


def check_broadcasts_to(op: str, name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    """`t` broadcasts to x's shape without enlarging it: the output has x's shape."""
    try:
        shape = torch.broadcast_shapes(t.shape, x.shape)
    except RuntimeError:
        shape = None
    if shape != x.shape:
        fail(op, f"{name} of shape {tuple(t.shape)} does not broadcast to the input's shape {tuple(x.shape)}")
