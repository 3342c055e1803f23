"""rocm_sd::geglu: the GEGLU epilogue of the transformer feed-forward (hip/geglu/geglu.hip).

    y = x[..., :D] * gelu(x[..., D:])      x: (..., 2D) contiguous, the projection's output (bias included)

What diffusers' GEGLU computes after its Linear, in one kernel instead of chunk + gelu + mul.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _ext, dispatch
from ._checks import check_floating, check_min_dims, fail
from ._common import DTYPE_CODES, dtype_reasons, stream_handle
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, layout_name, problem_key, tensor_key

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


def _fake(x):
    check_args(x)
    return _output(x)


def _key(x) -> str:
    x = as_meta(x)
    return problem_key(OP, dtype_name(x), layout_name(x), rows=x.numel() // max(x.shape[-1], 1), D=x.shape[-1] // 2)


def _samples(device, dtype) -> list[tuple]:
    """Half-widths 64 (the kernel's 8-wide vectors) and 7 (its scalar path)."""
    return [(torch.randn(2, 16, 2 * d, device=device, dtype=dtype),) for d in (64, 7)]


SPEC = OpSpec(OP, reference=geglu_ref, check_args=check_args, fake=_fake, supports=supports,
              launch=lambda plan, x: geglu_kernel(x), torch_path=lambda x: geglu_ref(x).contiguous(),
              plan_key=tensor_key, key=_key, candidates=lambda x: {dispatch.TORCH: geglu_ref, "rocm_sd": geglu_kernel},
              samples=_samples, kernel=geglu_kernel)


@SPEC.define
def geglu(x: torch.Tensor) -> torch.Tensor:
    """x[..., :D] * gelu(x[..., D:]) of the projection's output x (..., 2D)."""
