"""rocm_sd::geglu: the GEGLU epilogue of the transformer feed-forward (hip/geglu.hip).

    y = x[..., :D] * gelu(x[..., D:])      x: (..., 2D) contiguous, the projection's output (bias included)

What diffusers' GEGLU computes after its Linear, in one kernel instead of chunk + gelu + mul.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _ext, dispatch
from ._checks import check_floating, check_min_dims, fail
from ._common import (DTYPE_CODES, PlanCache, custom_op, dtype_reasons, kernel_reasons, stream_handle, tensor_key,
                      tuned_choice_for)

OP = "geglu"


def geglu_ref(x: torch.Tensor) -> torch.Tensor:
    """diffusers' GEGLU after the projection, op for op (exact gelu); differentiable."""
    hidden, gate = x.chunk(2, dim=-1)
    return hidden * F.gelu(gate)


def check_args(x: torch.Tensor) -> None:
    """Raises for what diffusers' GEGLU could not split into two halves (ops/_checks.py)."""
    check_floating(OP, input=x)
    check_min_dims(OP, x, 1, "(..., 2D)")
    if x.shape[-1] % 2:
        fail(OP, f"last dimension {x.shape[-1]} is odd: GEGLU splits it into two equal halves")


def input_reasons(x: torch.Tensor) -> list[str]:
    """Reasons in the argument itself that the kernel cannot take (no GPU needed to ask)."""
    reasons = dtype_reasons(x.dtype)
    if x.dim() == 0 or x.shape[-1] % 2:
        reasons.append(f"last dimension {tuple(x.shape)[-1:] or 'missing'} is not even")
    if x.numel() == 0:
        reasons.append("empty tensor")
    if not x.is_contiguous():
        reasons.append(f"strides {tuple(x.stride())} are not contiguous")
    return reasons


def _kernel_args(x: torch.Tensor, y: torch.Tensor):
    d = x.shape[-1] // 2
    return x.data_ptr(), y.data_ptr(), DTYPE_CODES[x.dtype], x.numel() // (2 * d), d


def supports(x: torch.Tensor) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x), lambda: _ext._C.geglu_check(*_kernel_args(x, x), x.device.index))


def _output(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[:-1] + (x.shape[-1] // 2,))


def geglu_kernel(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The HIP kernel itself, no dispatch (tests call it with a poisoned `out`)."""
    y = _output(x) if out is None else out
    _ext._C.geglu_forward(*_kernel_args(x, y), stream_handle(x.device), x.device.index)
    return y


_plans = PlanCache()


@custom_op("rocm_sd::geglu")
def geglu(x: torch.Tensor) -> torch.Tensor:
    def plan():
        check_args(x)
        return supports(x), tuned_choice_for(OP, x.device, (x,))

    reasons, tuned = _plans.get_or_compute(tensor_key(x), plan)
    if dispatch.choose(OP, reasons, tuned) == dispatch.KERNEL:
        return geglu_kernel(x)
    return geglu_ref(x).contiguous()


@geglu.register_fake
def _(x):
    check_args(x)
    return _output(x)
