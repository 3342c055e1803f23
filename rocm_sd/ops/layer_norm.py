"""rocm_sd::layer_norm: LayerNorm over the last dimension, one wave per row (hip/layer_norm/layer_norm.hip).

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
from ._common import DTYPE_CODES, dtype_reasons, param_reasons, stream_handle
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, layout_name, problem_key, tensor_key

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


def _torch_layer_norm(x, weight, bias, eps):
    """The PyTorch path of both ops, in x's dtype and contiguous as the kernel's output; fp32 parameters with a
    16-bit input (mixed precision) compute in fp32, as autocast would."""
    params = weight if weight is not None else bias
    if params is not None and params.dtype != x.dtype:
        return layer_norm_ref(x.float(), weight, bias, eps).to(x.dtype).contiguous()
    return layer_norm_ref(x, weight, bias, eps).contiguous()


def _fake(x, weight, bias, eps):
    check_args(x, weight, bias)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _key(x, weight, bias, eps, op=OP) -> str:
    x = as_meta(x)
    return problem_key(op, dtype_name(x), layout_name(x), rows=x.numel() // max(x.shape[-1], 1), D=x.shape[-1],
                       affine=int(weight is not None))


def _samples(device, dtype) -> list[tuple]:
    """320 channels (the kernel's vectors) and 33 (its scalar tail)."""
    return [(torch.randn(2, 8, c, device=device, dtype=dtype), torch.rand(c, device=device, dtype=dtype),
             torch.randn(c, device=device, dtype=dtype), 1e-5) for c in (320, 33)]


SPEC = OpSpec(OP, reference=layer_norm_ref, check_args=lambda x, weight, bias, eps: check_args(x, weight, bias),
              fake=_fake, supports=supports, launch=lambda plan, *args: layer_norm_kernel(*args),
              torch_path=_torch_layer_norm,
              plan_key=lambda x, weight, bias, eps: (tensor_key(x), tensor_key(weight), tensor_key(bias)), key=_key,
              candidates=lambda *args: {dispatch.TORCH: layer_norm_ref, "rocm_sd": layer_norm_kernel},
              samples=_samples, kernel=layer_norm_kernel)


@SPEC.define
def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm of x over its last dimension."""


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


def _residual_reasons(x: torch.Tensor, residual: torch.Tensor, name: str = "residual") -> list[str]:
    """Why a second (rows, C) operand cannot go with x to a row kernel: it must match x's shape, dtype and device,
    contiguous."""
    reasons = []
    if residual.shape != x.shape:
        reasons.append(f"{name} of shape {tuple(residual.shape)} differs from the input's {tuple(x.shape)}")
    if residual.dtype != x.dtype:
        reasons.append(f"{name} dtype {residual.dtype} differs from the input's {x.dtype}")
    if residual.device != x.device:
        reasons.append(f"{name} on {residual.device}, input on {x.device}")
    if not residual.is_contiguous():
        reasons.append(f"{name} strides {tuple(residual.stride())} are not contiguous")
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


def _add_torch_path(x, residual, weight, bias, eps):
    total = (x + residual).contiguous()
    return total, _torch_layer_norm(total, weight, bias, eps)


def _add_fake(x, residual, weight, bias, eps):
    dtype = check_add_args(x, residual, weight, bias)
    return (torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format),
            torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format))


def _add_samples(device, dtype) -> list[tuple]:
    return [(x, torch.randn_like(x), w, b, eps) for x, w, b, eps in _samples(device, dtype)]


ADD_SPEC = OpSpec(ADD_OP, reference=add_layer_norm_ref,
                  check_args=lambda x, residual, weight, bias, eps: check_add_args(x, residual, weight, bias),
                  fake=_add_fake, supports=add_layer_norm_supports,
                  launch=lambda plan, *args: add_layer_norm_kernel(*args), torch_path=_add_torch_path,
                  plan_key=lambda x, residual, weight, bias, eps: (tensor_key(x), tensor_key(residual),
                                                                   tensor_key(weight), tensor_key(bias)),
                  key=lambda x, residual, weight, bias, eps: _key(x, weight, bias, eps, ADD_OP),
                  candidates=lambda *args: {dispatch.TORCH: add_layer_norm_ref, "rocm_sd": add_layer_norm_kernel},
                  samples=_add_samples, kernel=add_layer_norm_kernel)


@ADD_SPEC.define
def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, layer_norm(x + residual))."""
