"""rocm_sd::conv_bias_residual: ResnetBlock2D's second convolution and its tail.

    y = (residual + (conv2d(x, weight, padding) + bias[c])) * scale      stride 1, dilation 1, one group

The op exists for the Composable Kernel instances that fuse bias, residual and scale into the convolution's
epilogue (ck_templates/ ConvBiasResidualInstance): the convolution's output is never written and read back.
Its default path is what the fused ResnetBlock2D always ran, the vendor convolution without bias (cuDNN /
MIOpen) then rocm_sd::bias_residual; a CK instance runs where the tuner measured it faster. The resnet patch
routes through this op only in builds that have CK instances (ROCm with CK headers).
"""
from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F

from .. import _ext, dispatch
from ._checks import check_floating, check_same_device, fail
from ._common import NHWC, ck_listing, constant_under_compile, layout_of, output_like, stream_handle
from .bias_residual import bias_residual, bias_residual_ref
from .spec import OpSpec, as_meta, ck_hosted_plan, device_of, dtype_name, layout_name, problem_key, tensor_key

OP = "conv_bias_residual"


def conv_bias_residual_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                           scale: float, pad_h: int, pad_w: int) -> torch.Tensor:
    """The convolution without bias, then rocm_sd::bias_residual's reference; differentiable."""
    return bias_residual_ref(F.conv2d(x, weight, None, 1, (pad_h, pad_w)), residual, bias, scale)


def conv_bias_residual_composed(x, weight, bias, residual, scale, pad_h, pad_w) -> torch.Tensor:
    """The default path: the vendor convolution, then rocm_sd::bias_residual (which dispatches and counts itself).
    The result has the residual's layout (what the fake kernel promises) whatever layout the convolution chose."""
    y = bias_residual.call(F.conv2d(x, weight, None, 1, (pad_h, pad_w)), residual, bias, scale)
    return y if y.stride() == residual.stride() else output_like(residual, y.dtype).copy_(y)


@cache
def ck_instances(device: torch.device | None = None) -> tuple[str, ...]:
    """Names of the CK convolution + bias + residual instances in this build (those with code for `device`'s GPU,
    given one): ROCm builds with CK headers only."""
    return tuple(ck_listing("ck_conv_bias_residual_instances", device))


def _out_shape(x, weight, pad_h, pad_w) -> tuple[int, ...]:
    return (x.shape[0], weight.shape[0], x.shape[2] + 2 * pad_h - weight.shape[2] + 1,
            x.shape[3] + 2 * pad_w - weight.shape[3] + 1)


def check_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, pad_h: int,
               pad_w: int) -> torch.dtype:
    """Raises what conv2d and the residual add would raise, and for a residual of another shape than the
    convolution's output (the op's output takes the residual's shape and layout); returns the output dtype."""
    check_floating(OP, input=x, weight=weight, bias=bias, residual=residual)
    check_same_device(OP, x, weight=weight, bias=bias, residual=residual)
    if x.dim() != 4 or weight.dim() != 4 or weight.shape[1] != x.shape[1]:
        fail(OP, f"input {tuple(x.shape)} and weight {tuple(weight.shape)} are not (N, C, H, W) and (K, C, R, S)")
    if weight.dtype != x.dtype:
        fail(OP, f"input dtype {x.dtype} and weight dtype {weight.dtype} should be the same")
    if tuple(bias.shape) != (weight.shape[0],):
        fail(OP, f"bias of shape {tuple(bias.shape)} is not a ({weight.shape[0]},) vector")
    if pad_h < 0 or pad_w < 0 or min(_out_shape(x, weight, pad_h, pad_w)[2:]) < 1:
        fail(OP, f"padding ({pad_h}, {pad_w}) of a {tuple(x.shape[2:])} input with {tuple(weight.shape[2:])} "
                 "kernels gives no output")
    if tuple(residual.shape) != _out_shape(x, weight, pad_h, pad_w):
        fail(OP, f"residual of shape {tuple(residual.shape)} is not the convolution's output shape "
                 f"{_out_shape(x, weight, pad_h, pad_w)}")
    return torch.promote_types(torch.promote_types(x.dtype, residual.dtype), bias.dtype)


@constant_under_compile  # asked inside patched forwards: torch.compile must not trace into _C
def hosts_ck() -> bool:
    """Whether this build has CK instances for the op (for any of its GPU targets): the patched modules route
    through it only then (on a GPU none of them is built for, the op runs its composed default)."""
    return bool(ck_instances())


def ck_reasons(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, pad_h: int,
               pad_w: int) -> list[str]:
    """Why the CK instances cannot take this call (no GPU needed to ask)."""
    reasons = []
    if any(t.dtype != torch.float16 for t in (x, weight, bias, residual)):
        reasons.append("CK convolution instances take fp16 input, weight, bias and residual")
    if x.dim() != 4 or weight.dim() != 4 or layout_of(x) != NHWC or not x.numel() \
            or not weight.is_contiguous(memory_format=torch.channels_last) or weight.shape[1] != x.shape[1]:
        reasons.append(f"input {tuple(x.shape)} and weight {tuple(weight.shape)} are not non-empty channels_last "
                       "(N, C, H, W) and (K, C, R, S)")
        return reasons
    if x.shape[1] % 8 or weight.shape[0] % 8:
        reasons.append("CK convolution instances read and write 8-element vectors: channels must be multiples of 8")
    if tuple(residual.shape) != _out_shape(x, weight, pad_h, pad_w) or layout_of(residual) != NHWC:
        reasons.append(f"residual {tuple(residual.shape)} is not the channels_last output "
                       f"{_out_shape(x, weight, pad_h, pad_w)}")
    if bias.dim() != 1 or bias.shape[0] != weight.shape[0] or not bias.is_contiguous():
        reasons.append(f"bias {tuple(bias.shape)} is not a contiguous vector of the {weight.shape[0]} output channels")
    return reasons


def conv_bias_residual_ck(name: str, x, weight, bias, residual, scale, pad_h, pad_w) -> torch.Tensor:
    """One CK instance by name (`ck_instances()`); it raises when it cannot take the call."""
    out = output_like(residual)
    (n, c, h, w), (k, _, r, s) = x.shape, weight.shape
    _ext._C.ck_conv_bias_residual_forward(name, x.data_ptr(), weight.data_ptr(), bias.data_ptr(), residual.data_ptr(),
                                          out.data_ptr(), [n, c, h, w, k, r, s, pad_h, pad_w], float(scale),
                                          stream_handle(x.device), x.device.index)
    return out


def _plan(x, weight, bias, residual, scale, pad_h, pad_w):
    return ck_hosted_plan(SPEC, (x, weight, bias, residual, scale, pad_h, pad_w), ck_instances(x.device),
                          lambda: ck_reasons(x, weight, bias, residual, pad_h, pad_w))


def _launch(plan, *args):
    if plan.detail is not None:
        return conv_bias_residual_ck(plan.detail, *args)
    return conv_bias_residual_composed(*args)


def _torch_path(x, weight, bias, residual, scale, pad_h, pad_w):
    y = conv_bias_residual_ref(x, weight, bias, residual, scale, pad_h, pad_w)  # in the promoted dtype check_args names
    return output_like(residual, y.dtype).copy_(y)


def _fake(x, weight, bias, residual, scale, pad_h, pad_w):
    return output_like(residual, check_args(x, weight, bias, residual, pad_h, pad_w))


def _plan_key(x, weight, bias, residual, scale, pad_h, pad_w):
    return tensor_key(x), tensor_key(weight), tensor_key(bias), tensor_key(residual), pad_h, pad_w


def _key(x, weight, bias, residual, scale, pad_h, pad_w) -> str:
    x, w = as_meta(x), as_meta(weight)
    return problem_key(OP, dtype_name(x), layout_name(x), N=x.shape[0], C=x.shape[1], H=x.shape[2], W=x.shape[3],
                       K=w.shape[0], R=w.shape[2], S=w.shape[3], pad=f"{pad_h}x{pad_w}")


def _candidates(x, weight, bias, residual, scale, pad_h, pad_w) -> dict:
    """PyTorch, the composed default, and each CK instance that takes the call."""
    candidates = {dispatch.TORCH: conv_bias_residual_ref, "rocm_sd": conv_bias_residual_composed}
    if not ck_reasons(*(as_meta(t) for t in (x, weight, bias, residual)), pad_h, pad_w):
        for name in ck_instances(device_of(x)):
            candidates[f"{dispatch.CK}:{name}"] = lambda *a, _name=name: conv_bias_residual_ck(_name, *a)
    return candidates


def _samples(device, dtype) -> list[tuple]:
    """A 3x3 convolution of 16 to 24 channels at 8x8, channels_last and NCHW."""
    def args(memory_format):
        x, weight = (torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=memory_format)
                     for shape in ((2, 16, 8, 8), (24, 16, 3, 3)))
        residual = torch.randn(2, 24, 8, 8, device=device, dtype=dtype).contiguous(memory_format=memory_format)
        return x, weight, torch.randn(24, device=device, dtype=dtype), residual, 0.5, 1, 1

    return [args(torch.channels_last), args(torch.contiguous_format)]


SPEC = OpSpec(OP, reference=conv_bias_residual_ref,
              check_args=lambda x, weight, bias, residual, scale, pad_h, pad_w:
                  check_args(x, weight, bias, residual, pad_h, pad_w),
              fake=_fake, supports=lambda *args: [],  # the composed default runs every call
              plan=_plan, launch=_launch, torch_path=_torch_path, plan_key=_plan_key, key=_key,
              candidates=_candidates, samples=_samples, ck_instances=ck_instances)


@SPEC.define
def conv_bias_residual(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                       scale: float, pad_h: int, pad_w: int) -> torch.Tensor:
    """(residual + conv2d(x, weight, padding) + bias[c]) * scale."""
