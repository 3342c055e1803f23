"""The AdaLN kernels writing their output as 8-bit rows for the projections that follow (optimize(precision="fp8" /
"int8") on the diffusion transformers), instead of the output itself:

    rocm_sd::ada_layer_norm_quantized(x, scale, shift, eps, format, bound)               -> (q, row_scale)
    rocm_sd::add_ada_layer_norm_quantized(x, y, gate, scale, shift, eps, format, bound)  -> (h, q, row_scale)

(q, row_scale) is exactly quantize_rows_ref(n, format, bound) of the n that rocm_sd::ada_layer_norm /
add_ada_layer_norm return, bit for bit (hip/ada_layer_norm/ada_layer_norm.hip quantizes the row it holds in
registers); h is add_ada_layer_norm's. n itself is not written: these are for norms whose every consumer multiplies
8-bit rows (modules/mmdit_8bit.py). The kernel takes fp16 / bf16 rows of a multiple of 8 channels with parameters it
can read in 16-byte vectors; every other call takes the PyTorch path, which computes the same definition.
"""
from __future__ import annotations


import torch

from .. import _ext, dispatch
from ._common import stream_handle
from .ada_layer_norm import _add_samples, _add_torch_path, _args, _gate_args, _param_reasons, _samples
from .ada_layer_norm import _torch_path as _modulated
from .ada_layer_norm import ada_layer_norm_ref, add_ada_layer_norm_ref, check_add_args, check_args, input_reasons
from .layer_norm import _residual_reasons
from .quantize import check_bound, check_format, quantize_rows_ref, quantized_like
from .quantized_outputs import _key as quantized_key
from .quantized_outputs import _quantized_args as quantized_outputs_args
from .quantized_outputs import _sixteen_bit, _with_format, kernel_widths
from .spec import OpSpec, as_meta, kernel_reasons, tensor_key

def _quantized_args(q, row_scale, format: str, bound: float) -> dict:
    """quantized_outputs' arguments of the quantized rows, the row scales under the binding's name `q_scale` (its
    `scale` is the modulation's)."""
    args = quantized_outputs_args(q, row_scale, format, bound)
    args["q_scale"] = args.pop("scale")
    return args


def _without_out(x, scale, shift, eps) -> tuple:
    """ada_layer_norm's kernel arguments with no out: only q and row_scale (and h) are written."""
    x_ptr, _, *rest = _args(x, x, scale, shift, eps)
    return (x_ptr, 0, *rest)


def _quantized_key(op, x, format, bound):
    return quantized_key(op, x, format, bound, as_meta(x).shape[-1])


# ---- ada_layer_norm_quantized ------------------------------------------------------------------------------

OP = "ada_layer_norm_quantized"


def ada_layer_norm_quantized_ref(x, scale, shift, eps, format, bound=0.0):
    return quantize_rows_ref(ada_layer_norm_ref(x, scale, shift, eps), format, bound)


def _check(x, scale, shift, eps, format, bound=0.0, op=OP):
    check_args(x, scale, shift, op)
    check_format(op, format)
    check_bound(op, format, bound)


def supports(x, scale, shift, eps, format, bound=0.0) -> list[str]:
    return kernel_reasons(x.device, input_reasons(x, scale, shift) + _sixteen_bit(x),
                          lambda: _ext._C.ada_layer_norm_check(*_without_out(x, scale, shift, eps), x.device.index,
                                                               **_quantized_args(None, None, format, bound)))


def ada_layer_norm_quantized_kernel(x, scale, shift, eps, format, bound=0.0, out=None):
    """The HIP kernel itself, no dispatch; `out`: (q, row_scale) to write into."""
    q, row_scale = quantized_like(x, format) if out is None else out
    _ext._C.ada_layer_norm_forward(*_without_out(x, scale, shift, eps), stream_handle(x.device), x.device.index,
                                   **_quantized_args(q, row_scale, format, bound))
    return q, row_scale


def _torch_path(x, scale, shift, eps, format, bound=0.0):
    return quantize_rows_ref(_modulated(x, scale, shift, eps), format, bound)


def _fake(x, scale, shift, eps, format, bound=0.0):
    dtype = check_args(x, scale, shift, OP)
    check_format(OP, format)
    check_bound(OP, format, bound)
    return quantized_like(torch.empty_like(x, dtype=dtype), format)


SPEC = OpSpec(OP, reference=ada_layer_norm_quantized_ref, check_args=_check, fake=_fake, supports=supports,
              launch=lambda plan, *args: ada_layer_norm_quantized_kernel(*args), torch_path=_torch_path,
              plan_key=lambda x, scale, shift, eps, format, bound=0.0: (tensor_key(x), tensor_key(scale),
                                                                         tensor_key(shift), format, bound),
              key=lambda x, scale, shift, eps, format, bound=0.0: _quantized_key(OP, x, format, bound),
              candidates=lambda *args: {dispatch.TORCH: _torch_path, "rocm_sd": ada_layer_norm_quantized_kernel},
              samples=lambda device, dtype: _with_format(kernel_widths(_samples(device, dtype))),
              kernel=ada_layer_norm_quantized_kernel)


@SPEC.define
def ada_layer_norm_quantized(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float, format: str,
                             bound: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, row_scale): layer_norm(x) * (1 + scale[:, None]) + shift[:, None] quantized per row into `format` (with a
    bound > 0, one scale for every row: bound / fmax), the modulated rows themselves not kept."""


# ---- add_ada_layer_norm_quantized --------------------------------------------------------------------------

ADD_OP = "add_ada_layer_norm_quantized"


def add_ada_layer_norm_quantized_ref(x, y, gate, scale, shift, eps, format, bound=0.0):
    h, n = add_ada_layer_norm_ref(x, y, gate, scale, shift, eps)
    return (h, *quantize_rows_ref(n, format, bound))


def _add_check(x, y, gate, scale, shift, eps, format, bound=0.0):
    check_add_args(x, y, gate, scale, shift, ADD_OP)
    check_format(ADD_OP, format)
    check_bound(ADD_OP, format, bound)


def add_supports(x, y, gate, scale, shift, eps, format, bound=0.0) -> list[str]:
    reasons = (input_reasons(x, scale, shift) + _residual_reasons(x, y, "y") + _param_reasons(x, gate=gate)
               + _sixteen_bit(x))
    return kernel_reasons(x.device, reasons,
                          lambda: _ext._C.ada_layer_norm_check(*_without_out(x, scale, shift, eps), x.device.index,
                                                               **_gate_args(y, gate, x),
                                                               **_quantized_args(None, None, format, bound)))


def add_ada_layer_norm_quantized_kernel(x, y, gate, scale, shift, eps, format, bound=0.0, out=None):
    """The HIP kernel itself, no dispatch; `out`: (h, q, row_scale) to write into (h may be x, as add_ada_layer_norm's)."""
    h, q, row_scale = (torch.empty_like(x), *quantized_like(x, format)) if out is None else out
    _ext._C.ada_layer_norm_forward(*_without_out(x, scale, shift, eps), stream_handle(x.device), x.device.index,
                                   **_gate_args(y, gate, h), **_quantized_args(q, row_scale, format, bound))
    return h, q, row_scale


def _add_torch_path_quantized(x, y, gate, scale, shift, eps, format, bound=0.0):
    h, n = _add_torch_path(x, y, gate, scale, shift, eps)
    return (h, *quantize_rows_ref(n, format, bound))


def _add_fake(x, y, gate, scale, shift, eps, format, bound=0.0):
    h_dtype, n_dtype = check_add_args(x, y, gate, scale, shift, ADD_OP)
    check_format(ADD_OP, format)
    check_bound(ADD_OP, format, bound)
    return (torch.empty_like(x, dtype=h_dtype, memory_format=torch.contiguous_format),
            *quantized_like(torch.empty_like(x, dtype=n_dtype), format))


ADD_SPEC = OpSpec(ADD_OP, reference=add_ada_layer_norm_quantized_ref, check_args=_add_check, fake=_add_fake,
                  supports=add_supports, launch=lambda plan, *args: add_ada_layer_norm_quantized_kernel(*args),
                  torch_path=_add_torch_path_quantized,
                  plan_key=lambda x, y, gate, scale, shift, eps, format, bound=0.0: (
                      *(tensor_key(t) for t in (x, y, gate, scale, shift)), format, bound),
                  key=lambda x, y, gate, scale, shift, eps, format, bound=0.0: _quantized_key(ADD_OP, x, format,
                                                                                              bound),
                  candidates=lambda *args: {dispatch.TORCH: _add_torch_path_quantized,
                                            "rocm_sd": add_ada_layer_norm_quantized_kernel},
                  samples=lambda device, dtype: _with_format(kernel_widths(_add_samples(device, dtype))),
                  kernel=add_ada_layer_norm_quantized_kernel)


@ADD_SPEC.define
def add_ada_layer_norm_quantized(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor,
                                 shift: torch.Tensor, eps: float, format: str,
                                 bound: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, q, row_scale): h = x + gate[:, None] * y, and ada_layer_norm of h quantized per row into `format` (with a
    bound > 0, one scale for every row), the modulated rows themselves not kept."""
