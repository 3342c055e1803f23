"""rocm_sd::layout_copy: a 4-D tensor copied between NCHW and channels_last (NHWC) memory (hip/layout_copy.hip).

    layout_copy(x, channels_last=True):  contiguous NCHW x  -> the same values, channels_last
    layout_copy(x, channels_last=False): channels_last x    -> the same values, contiguous

The kernel is a batched transpose through registers with 16-byte vectors on both sides where C and H*W allow
(multiples of 8 elements for 2-byte types, 4 for float32), narrower vectors otherwise. The PyTorch path is
`torch.empty(..., memory_format=...).copy_(x)`, which also takes every other stride pattern.

rocm_sd.optimize keeps activations channels_last end to end, so no conversion is left on its hot path (the
layout item of the kernel issue); this is the copy for the boundaries where one remains (a host app handing
over NCHW tensors, NCHW outputs for code that wants them), measured against the copy ceiling by
bench/bench_layout_copy.py.
"""
from __future__ import annotations

import torch

from .. import _ext, dispatch
from ._checks import fail
from ._common import (DTYPE_CODES, PlanCache, custom_op, dtype_reasons, kernel_reasons, stream_handle, tensor_key,
                      tuned_choice_for)

OP = "layout_copy"


def _format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def _output(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=_format(channels_last))


def layout_copy_ref(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """PyTorch's strided copy into a new tensor of the requested memory format (never x itself)."""
    return _output(x, channels_last).copy_(x)


def check_args(x: torch.Tensor, channels_last: bool) -> None:
    """PyTorch's rule: only 4-D tensors have a channels_last memory format."""
    if channels_last and x.dim() != 4:
        fail(OP, f"a {x.dim()}-D tensor has no channels_last layout (4-D (N, C, H, W) only)")


def input_reasons(x: torch.Tensor, channels_last: bool) -> list[str]:
    reasons = dtype_reasons(x.dtype)
    if x.dim() != 4:
        reasons.append(f"{x.dim()}-D tensor (the kernel takes (N, C, H, W))")
    elif x.numel() == 0:
        reasons.append("empty tensor")
    elif channels_last and not x.is_contiguous():
        reasons.append(f"strides {tuple(x.stride())} are not dense NCHW (the source of a copy to channels_last)")
    elif not channels_last and not x.is_contiguous(memory_format=torch.channels_last):
        reasons.append(f"strides {tuple(x.stride())} are not dense channels_last (the source of a copy to NCHW)")
    return reasons


def _call(x, out, channels_last, stream, mode):
    n, c, h, w = x.shape
    return _ext._C.layout_copy_forward(x.data_ptr(), out.data_ptr(), DTYPE_CODES[x.dtype], n, c, h * w, channels_last,
                                       stream, x.device.index, mode)


def supports(x: torch.Tensor, channels_last: bool) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x, channels_last), lambda: _call(x, x, channels_last, 0, "check"))


def describe(x: torch.Tensor, channels_last: bool) -> str:
    """The vector width and grid the kernel takes for this call ("vec=8 blocks=40"), or 'error: <why>'."""
    return _call(x, x, channels_last, 0, "describe")


# Untuned, the kernel runs where it beat PyTorch's copy on the H200 (bench/results/...-layout_copy-*): full
# 16-byte vectors and a grid of at least MIN_BLOCKS blocks. Narrower vectors (C = 3 images, C = 4 fp16 latents)
# and grids too small to fill the GPU take PyTorch's copy unless `python -m rocm_sd.tune` measured otherwise.
MIN_BLOCKS = 32


def default_choice(x: torch.Tensor, channels_last: bool) -> str:
    fields = dict(item.split("=") for item in describe(x, channels_last).split())
    full_vectors = int(fields["vec"]) * x.element_size() == 16
    return dispatch.KERNEL if full_vectors and int(fields["blocks"]) >= MIN_BLOCKS else dispatch.TORCH


def layout_copy_kernel(x: torch.Tensor, channels_last: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """The HIP kernel itself, no dispatch."""
    y = _output(x, channels_last) if out is None else out
    _call(x, y, channels_last, stream_handle(x.device), "run")
    return y


_plans = PlanCache()


def _plan(x, channels_last) -> tuple[list[str], str | None]:
    """(reasons against the kernel, the choice): the tuning database's, else default_choice (a policy, counted
    as torch with no notice)."""
    check_args(x, channels_last)
    reasons = supports(x, channels_last)
    tuned = tuned_choice_for(OP, x.device, (x, channels_last))
    if tuned is None and not reasons:
        tuned = default_choice(x, channels_last)
    return reasons, tuned


@custom_op("rocm_sd::layout_copy")
def layout_copy(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    key = (tensor_key(x), channels_last)
    reasons, choice = _plans.get_or_compute(key, lambda: _plan(x, channels_last))
    if dispatch.choose(OP, reasons, choice) == dispatch.KERNEL:
        return layout_copy_kernel(x, channels_last)
    return layout_copy_ref(x, channels_last)


@layout_copy.register_fake
def _(x, channels_last):
    check_args(x, channels_last)
    return _output(x, channels_last)
