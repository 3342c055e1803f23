"""rocm_sd::bias_residual: a convolution's bias and the residual add in one pass (hip/bias_residual/bias_residual.hip).

    y = (x + residual + bias[c]) * scale       x, residual: same shape and layout (NCHW or channels_last)

ResnetBlock2D's tail, `(input + conv2(h)) / output_scale_factor`, with conv2 run without its bias.
"""
from __future__ import annotations

import torch

from .. import _ext, dispatch
from ._checks import check_broadcasts_to, check_floating, check_min_dims, check_same_device, fail
from ._common import DTYPE_CODES, dtype_reasons, into_output, layout_of, output_like, stream_handle
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, layout_name, problem_key, spatial_size, tensor_key

OP = "bias_residual"


def bias_residual_ref(x: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """(residual + (x + bias)) * scale in PyTorch ops: conv2's output with its bias, plus the shortcut."""
    return (residual + (x + bias.reshape(bias.shape + (1,) * (x.dim() - 2)))) * scale


def check_args(x: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor) -> torch.dtype:
    """Raises what the reference's PyTorch ops would raise, and for a residual that would enlarge the output
    (which the op's output, in x's shape, cannot hold); returns the output dtype (PyTorch's type promotion)."""
    check_floating(OP, input=x, residual=residual, bias=bias)
    check_min_dims(OP, x, 2, "(N, C, ...)")
    check_same_device(OP, x, residual=residual, bias=bias)
    check_broadcasts_to(OP, "residual", residual, x)
    if tuple(bias.shape) != (x.shape[1],):
        fail(OP, f"bias of shape {tuple(bias.shape)} is not a ({x.shape[1]},) vector")
    return torch.promote_types(torch.promote_types(x.dtype, residual.dtype), bias.dtype)


def input_reasons(x: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor) -> list[str]:
    reasons = dtype_reasons(x.dtype)
    if x.dim() != 4:
        reasons.append(f"input has {x.dim()} dims, needs (N, C, H, W)")
    if x.numel() == 0:
        reasons.append("empty tensor")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        reasons.append(f"residual {tuple(residual.shape)} {residual.dtype} on {residual.device} does not match the "
                       f"input {tuple(x.shape)} {x.dtype} on {x.device}")
    elif layout_of(x) is None or layout_of(residual) != layout_of(x) or residual.stride() != x.stride():
        reasons.append(f"strides {tuple(x.stride())} and {tuple(residual.stride())} are not one dense layout")
    if bias.dim() != 1 or (x.dim() > 1 and bias.shape[0] != x.shape[1]) or bias.dtype != x.dtype \
            or not bias.is_contiguous() or bias.device != x.device:
        reasons.append(f"bias {tuple(bias.shape)} {bias.dtype} is not a contiguous (C,) vector of the input's dtype")
    return reasons


def _args(x, residual, bias, y, scale):
    n, c = x.shape[0], x.shape[1]
    return (x.data_ptr(), residual.data_ptr(), bias.data_ptr(), y.data_ptr(), DTYPE_CODES[x.dtype], layout_of(x), n, c,
            x.numel() // (n * c), float(scale))


def supports(x: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor, scale: float) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x, residual, bias),
                          lambda: _ext._C.bias_residual_check(*_args(x, residual, bias, x, scale), x.device.index))


def bias_residual_kernel(x, residual, bias, scale, out=None):
    """The HIP kernel itself, no dispatch."""
    y = output_like(x) if out is None else out
    _ext._C.bias_residual_forward(*_args(x, residual, bias, y, scale), stream_handle(x.device), x.device.index)
    return y


def _torch_path(x, residual, bias, scale):
    y = bias_residual_ref(x, residual, bias, scale)  # in the promoted dtype check_args names
    return into_output(x, y, y.dtype)


def _key(x, residual, bias, scale) -> str:
    x = as_meta(x)
    return problem_key(OP, dtype_name(x), layout_name(x), N=x.shape[0], C=x.shape[1], HW=spatial_size(x))


def _samples(device, dtype) -> list[tuple]:
    """64 channels at 8x8, NCHW and channels_last."""
    def args(memory_format):
        x, residual = (torch.randn(2, 64, 8, 8, device=device, dtype=dtype).to(memory_format=memory_format)
                       for _ in range(2))
        return x, residual, torch.randn(64, device=device, dtype=dtype), 0.5

    return [args(torch.contiguous_format), args(torch.channels_last)]


SPEC = OpSpec(OP, reference=bias_residual_ref, check_args=lambda x, residual, bias, scale: check_args(x, residual, bias),
              fake=lambda x, residual, bias, scale: output_like(x, check_args(x, residual, bias)), supports=supports,
              launch=lambda plan, *args: bias_residual_kernel(*args), torch_path=_torch_path,
              plan_key=lambda x, residual, bias, scale: (tensor_key(x), tensor_key(residual), tensor_key(bias)),
              key=_key, candidates=lambda *args: {dispatch.TORCH: bias_residual_ref, "rocm_sd": bias_residual_kernel},
              samples=_samples, kernel=bias_residual_kernel)


@SPEC.define
def bias_residual(x: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """(x + residual + bias[c]) * scale."""
