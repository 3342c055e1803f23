"""rocm_sd::layer_norm: LayerNorm over the last dimension, one wave per row (hip/layer_norm.hip).

    y = (x - mean) / sqrt(var + eps) * weight + bias       x: (..., C) contiguous, C up to 4096 (fp16 on wave32)

rocm_sd::add_layer_norm: its residual form (ONNX Runtime's SkipLayerNorm), the transformer block's
"h = attn_out + h; n = norm2(h)" in one pass over the rows instead of an add and a norm:

    h = x + residual;  y = layer_norm(h)          returns (h, y)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _ext, dispatch
from ._checks import check_broadcasts_to, check_floating, check_min_dims, check_norm_params, check_same_device
from ._common import (DTYPE_CODES, PlanCache, custom_op, dtype_reasons, kernel_reasons, param_reasons, stream_handle,
                      tensor_key, tuned_choice_for)

OP = "layer_norm"


def layer_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """torch.nn.functional.layer_norm over the last dimension; differentiable."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def check_args(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, op: str = OP,
               dtype: torch.dtype | None = None) -> None:
    """Raises what PyTorch's LayerNorm would raise for these arguments (ops/_checks.py)."""
    check_floating(op, input=x)
    check_min_dims(op, x, 1, "(..., C)")
    check_norm_params(op, x, weight, bias, x.shape[-1], dtype)


def input_reasons(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> list[str]:
    reasons = dtype_reasons(x.dtype)
    if x.dim() == 0 or x.numel() == 0:
        reasons.append("empty tensor")
    if not x.is_contiguous():
        reasons.append(f"strides {tuple(x.stride())} are not contiguous")
    return reasons + param_reasons(x, weight, bias, x.shape[-1] if x.dim() else None)


def _args(x, y, weight, bias, eps):
    params = weight if weight is not None else bias
    c = x.shape[-1]
    return (x.data_ptr(), y.data_ptr(), weight.data_ptr() if weight is not None else 0,
            bias.data_ptr() if bias is not None else 0, DTYPE_CODES[x.dtype],
            DTYPE_CODES[params.dtype] if params is not None else DTYPE_CODES[x.dtype], x.numel() // c, c, float(eps))


def _residual_args(residual, total):
    return {"residual": residual.data_ptr(), "sum": total.data_ptr()} if residual is not None else {}


def supports(x, weight, bias, eps) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x, weight, bias),
                          lambda: _ext._C.layer_norm_check(*_args(x, x, weight, bias, eps), x.device.index))


def layer_norm_kernel(x, weight, bias, eps, out=None):
    """The HIP kernel itself, no dispatch."""
    y = torch.empty_like(x) if out is None else out
    _ext._C.layer_norm_forward(*_args(x, y, weight, bias, eps), stream_handle(x.device), x.device.index)
    return y


_plans = PlanCache()


@custom_op("rocm_sd::layer_norm")
def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    def plan():
        check_args(x, weight, bias)
        return supports(x, weight, bias, eps), tuned_choice_for(OP, x.device, (x, weight, bias, eps))

    reasons, tuned = _plans.get_or_compute((tensor_key(x), tensor_key(weight), tensor_key(bias)), plan)
    if dispatch.choose(OP, reasons, tuned) == dispatch.KERNEL:
        return layer_norm_kernel(x, weight, bias, eps)
    return _torch_layer_norm(x, weight, bias, eps)


def _torch_layer_norm(x, weight, bias, eps):
    """The PyTorch path of both ops, in x's dtype and contiguous as the kernel's output; fp32 parameters with a
    16-bit input (mixed precision) compute in fp32, as autocast would."""
    params = weight if weight is not None else bias
    if params is not None and params.dtype != x.dtype:
        return layer_norm_ref(x.float(), weight, bias, eps).to(x.dtype).contiguous()
    return layer_norm_ref(x, weight, bias, eps).contiguous()


@layer_norm.register_fake
def _(x, weight, bias, eps):
    check_args(x, weight, bias)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# ---- add_layer_norm ---------------------------------------------------------------------------------------

ADD_OP = "add_layer_norm"


def add_layer_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                       bias: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, layer_norm(x + residual)): what the unpatched transformer block computes."""
    total = x + residual
    return total, layer_norm_ref(total, weight, bias, eps)


def check_add_args(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                   bias: torch.Tensor | None) -> torch.dtype:
    """Raises what x + residual and PyTorch's LayerNorm would raise; returns the sum's (the outputs') dtype."""
    check_floating(ADD_OP, input=x, residual=residual)
    check_same_device(ADD_OP, x, residual=residual)
    check_broadcasts_to(ADD_OP, "residual", residual, x)
    dtype = torch.promote_types(x.dtype, residual.dtype)
    check_args(x, weight, bias, ADD_OP, dtype)
    return dtype


def _residual_reasons(x: torch.Tensor, residual: torch.Tensor) -> list[str]:
    reasons = []
    if residual.shape != x.shape:
        reasons.append(f"residual of shape {tuple(residual.shape)} differs from the input's {tuple(x.shape)}")
    if residual.dtype != x.dtype:
        reasons.append(f"residual dtype {residual.dtype} differs from the input's {x.dtype}")
    if residual.device != x.device:
        reasons.append(f"residual on {residual.device}, input on {x.device}")
    if not residual.is_contiguous():
        reasons.append(f"residual strides {tuple(residual.stride())} are not contiguous")
    return reasons


def add_layer_norm_supports(x, residual, weight, bias, eps) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x, weight, bias) + _residual_reasons(x, residual),
                          lambda: _ext._C.layer_norm_check(*_args(x, x, weight, bias, eps), x.device.index,
                                                           **_residual_args(residual, x)))


def add_layer_norm_kernel(x, residual, weight, bias, eps, out=None):
    """The HIP kernel itself, no dispatch; `out`: (sum, y) to write into."""
    total, y = (torch.empty_like(x), torch.empty_like(x)) if out is None else out
    _ext._C.layer_norm_forward(*_args(x, y, weight, bias, eps), stream_handle(x.device), x.device.index,
                               **_residual_args(residual, total))
    return total, y


_add_plans = PlanCache()


@custom_op("rocm_sd::add_layer_norm")
def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    def plan():
        check_add_args(x, residual, weight, bias)
        return (add_layer_norm_supports(x, residual, weight, bias, eps),
                tuned_choice_for(ADD_OP, x.device, (x, residual, weight, bias, eps)))

    key = (tensor_key(x), tensor_key(residual), tensor_key(weight), tensor_key(bias))
    reasons, tuned = _add_plans.get_or_compute(key, plan)
    if dispatch.choose(ADD_OP, reasons, tuned) == dispatch.KERNEL:
        return add_layer_norm_kernel(x, residual, weight, bias, eps)
    total = (x + residual).contiguous()
    return total, _torch_layer_norm(total, weight, bias, eps)


@add_layer_norm.register_fake
def _(x, residual, weight, bias, eps):
    dtype = check_add_args(x, residual, weight, bias)
    return (torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format),
            torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format))
