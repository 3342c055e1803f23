"""rocm_sd::parity_shuffle: the pixel shuffle of the folded upsampling convolution, with its bias
(hip/parity_shuffle/parity_shuffle.hip; rocm_sd/modules/upsample.py makes the parities).

    out[n, c, 2i + a, 2j + b] = parities[n, (2a + b) C + c, i + a, j + b] + bias[c]

parities: (N, 4C, H + 1, W + 1), the folded 2x2 convolution's output; out: (N, C, 2H, 2W) in the same
layout. The kernel takes channels_last: one pass instead of four strided copies and the bias pass.
"""
from __future__ import annotations

import torch

from .. import _ext, dispatch
from ._checks import check_floating, check_same_device, fail
from ._common import DTYPE_CODES, NHWC, dtype_reasons, layout_of, stream_handle
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, layout_name, problem_key, tensor_key

OP = "parity_shuffle"


def _output(parities: torch.Tensor) -> torch.Tensor:
    """The upsampled image, in the parities' layout (channels_last, which the kernel takes, or NCHW)."""
    n, c4, h1, w1 = parities.shape
    channels_last = layout_of(parities) == NHWC and not parities.is_contiguous()
    return torch.empty((n, c4 // 4, 2 * (h1 - 1), 2 * (w1 - 1)), device=parities.device, dtype=parities.dtype,
                       memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def parity_shuffle_ref(parities: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Four strided copies (one per output parity), then the bias: the definition, in PyTorch ops."""
    out = _output(parities)
    c, h, w = out.shape[1], parities.shape[2] - 1, parities.shape[3] - 1
    for a in (0, 1):
        for b in (0, 1):
            block = 2 * a + b
            out[:, :, a::2, b::2].copy_(parities[:, block * c:(block + 1) * c, a:a + h, b:b + w])
    return out if bias is None else out.add_(bias.reshape(1, c, 1, 1))


def check_args(parities: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Raises for arguments that are not (N, 4C, H + 1, W + 1) parities with a (C,) bias (ops/_checks.py)."""
    check_floating(OP, parities=parities, bias=bias)
    check_same_device(OP, parities, bias=bias)
    if parities.dim() != 4 or parities.shape[1] % 4 or parities.shape[2] < 2 or parities.shape[3] < 2:
        fail(OP, f"parities of shape {tuple(parities.shape)} are not (N, 4C, H + 1, W + 1) with H, W >= 1")
    if bias is not None and tuple(bias.shape) != (parities.shape[1] // 4,):
        fail(OP, f"bias of shape {tuple(bias.shape)} is not a ({parities.shape[1] // 4},) vector")


def input_reasons(parities: torch.Tensor, bias: torch.Tensor | None) -> list[str]:
    reasons = dtype_reasons(parities.dtype)
    if parities.dim() != 4 or parities.shape[1] % 4 or parities.shape[2] < 2 or parities.shape[3] < 2:
        reasons.append(f"parities of shape {tuple(parities.shape)} are not (N, 4C, H + 1, W + 1) with H, W >= 1")
    elif parities.numel() == 0:
        reasons.append("empty tensor")
    elif layout_of(parities) != NHWC or parities.is_contiguous():
        reasons.append(f"strides {tuple(parities.stride())} are not a dense channels_last layout")
    if bias is not None and (bias.dim() != 1 or parities.dim() != 4 or bias.shape[0] * 4 != parities.shape[1]
                             or bias.dtype != parities.dtype or bias.device != parities.device
                             or not bias.is_contiguous()):
        reasons.append(f"bias {tuple(bias.shape)} {bias.dtype} is not a contiguous (C,) vector of the input's dtype")
    return reasons


def _args(parities, bias, out):
    n, c4, h1, w1 = parities.shape
    return (parities.data_ptr(), bias.data_ptr() if bias is not None else 0, out.data_ptr(), DTYPE_CODES[parities.dtype],
            n, h1 - 1, w1 - 1, c4 // 4)


def supports(parities: torch.Tensor, bias: torch.Tensor | None) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(parities.device, input_reasons(parities, bias),
                          lambda: _ext._C.parity_shuffle_check(*_args(parities, bias, parities), parities.device.index))


def parity_shuffle_kernel(parities, bias, out=None):
    """The HIP kernel itself, no dispatch."""
    y = _output(parities) if out is None else out
    _ext._C.parity_shuffle_forward(*_args(parities, bias, y), stream_handle(parities.device), parities.device.index)
    return y


def _fake(parities, bias):
    check_args(parities, bias)
    return _output(parities)


def _key(parities, bias) -> str:
    p = as_meta(parities)
    return problem_key(OP, dtype_name(p), layout_name(p), N=p.shape[0], C=p.shape[1] // 4, H=p.shape[2] - 1,
                       W=p.shape[3] - 1, bias=int(bias is not None))


def _samples(device, dtype) -> list[tuple]:
    """16 channels (8-wide vectors) and 3 (scalar), channels_last parities of a 4x5 input."""
    return [(torch.randn(2, 4 * c, 5, 6, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last),
             torch.randn(c, device=device, dtype=dtype)) for c in (16, 3)]


SPEC = OpSpec(OP, reference=parity_shuffle_ref, check_args=check_args, fake=_fake, supports=supports,
              launch=lambda plan, parities, bias: parity_shuffle_kernel(parities, bias), torch_path=parity_shuffle_ref,
              plan_key=lambda parities, bias: (tensor_key(parities), tensor_key(bias)), key=_key,
              candidates=lambda *args: {dispatch.TORCH: parity_shuffle_ref, "rocm_sd": parity_shuffle_kernel},
              samples=_samples, kernel=parity_shuffle_kernel)


@SPEC.define
def parity_shuffle(parities: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The folded upsampling's pixel shuffle with its bias: the module docstring's formula."""
