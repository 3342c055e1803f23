"""The kernels that quantize their own output for the 8-bit GEMMs that follow (optimize(precision="fp8"/"int8")):
each is its kernel plus rocm_sd::quantize_rows of the output it already holds, so the GEMM's input costs no
second pass over memory.

    rocm_sd::layer_norm_quantize_rows(x, w, b, eps, format, bound)               -> (y, q, scale)       hip/layer_norm/
    rocm_sd::add_layer_norm_quantize_rows(x, residual, w, b, eps, format, bound) -> (sum, y, q, scale)  hip/layer_norm/
    rocm_sd::layer_norm_quantized(x, w, b, eps, format, bound)                   -> (q, scale)          hip/layer_norm/
    rocm_sd::add_layer_norm_quantized(x, residual, w, b, eps, format, bound)     -> (sum, q, scale)     hip/layer_norm/
    rocm_sd::geglu_quantize_rows(x, format, bound)                               -> (y, q, scale)       hip/geglu/
    rocm_sd::geglu_quantized(x, format, bound)                                   -> (q, scale)          hip/geglu/

y (and sum) are what rocm_sd::layer_norm / add_layer_norm / geglu return; (q, scale) is exactly
quantize_rows_ref(y, format, bound) of that y, bit for bit: with bound 0 (the default) each row's own scale, with a
bound > 0 (no value of y can exceed it: patch/precision.py derives it from the weights) one scale for every row,
bound / fmax, which the per-tensor FP8 GEMM takes. The `_quantized` ops write no y: they are for layers that take
nothing else (the norms': modules/transformer.py; the GEGLU's: modules/geglu.py), and move fewer bytes than the plain
kernels. The kernels take fp16 / bf16 activations (LayerNorm: C a multiple of
8); everything else takes the PyTorch path, which computes the same definition.
"""
from __future__ import annotations

import functools

import torch

from .. import _ext, dispatch
from ._common import stream_handle
from .geglu import _kernel_args as _geglu_args
from .geglu import _output as _geglu_output
from .geglu import check_args as check_geglu_args
from .geglu import geglu_ref
from .geglu import input_reasons as geglu_input_reasons
from .layer_norm import _add_torch_path, _args, _residual_args, _residual_reasons, _samples, _torch_layer_norm
from .layer_norm import add_layer_norm_ref, check_add_args
from .layer_norm import check_args as check_layer_norm_args
from .layer_norm import input_reasons as layer_norm_input_reasons
from .layer_norm import layer_norm_ref
from .quantize import FORMATS, check_bound, check_format, quantize_rows_ref, quantized_like
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, problem_key, tensor_key

# The C++ checks ask for q and scale pointers only for their alignment: a fresh allocation's.
_ALIGNED = 256


def _quantized_args(q: torch.Tensor | None, scale: torch.Tensor | None, format: str, bound: float) -> dict:
    return {"q": q.data_ptr() if q is not None else _ALIGNED, "scale": scale.data_ptr() if scale is not None
            else _ALIGNED, "format": FORMATS[format][0], "bound": float(bound)}


def _sixteen_bit(x: torch.Tensor) -> list[str]:
    return [] if x.dtype in (torch.float16, torch.bfloat16) else [f"quantized output needs fp16 or bf16, not {x.dtype}"]


def _with_format(samples: list[tuple]) -> list[tuple]:
    """The first sample in every format, the others in the first; each fp8 one also with a bound (one scale per tensor)
    that some of its values exceed (they saturate)."""
    fp8 = [format for format in FORMATS if format != "int8"]
    return ([(*samples[0], format, 0.0) for format in FORMATS] + [(*samples[0], format, 2.0) for format in fp8]
            + [(*args, fp8[0], bound) for args in samples[1:] for bound in (0.0, 3.0)])


def kernel_widths(samples: list[tuple]) -> list[tuple]:
    """The samples of a plain op that its quantized-output kernel takes: a last dimension of a multiple of 8 (the plain
    ops' scalar-tail samples take the plain op and quantize_rows instead: the kernels' checks say so)."""
    return [args for args in samples if args[0].shape[-1] % 8 == 0]


def _layer_norm_samples(device, dtype) -> list[tuple]:
    """layer_norm's 320-channel sample (kernel_widths) and a 1280-channel one (several vectors a lane on wave32)."""
    return kernel_widths(_samples(device, dtype)) + [
        (torch.randn(2, 3, 1280, device=device, dtype=dtype), torch.rand(1280, device=device, dtype=dtype),
         torch.randn(1280, device=device, dtype=dtype), 1e-6)]


def _key(op: str, x, format: str, bound: float, d: int, **extra) -> str:
    x = as_meta(x)
    if bound > 0:
        extra["scale"] = "tensor"
    return problem_key(op, dtype_name(x), format, rows=x.numel() // max(x.shape[-1], 1), D=d, **extra)


# ---- layer_norm_quantize_rows ------------------------------------------------------------------------------

LN_OP = "layer_norm_quantize_rows"


def layer_norm_quantize_rows_ref(x, weight, bias, eps, format, bound=0.0):
    y = layer_norm_ref(x, weight, bias, eps)
    return (y, *quantize_rows_ref(y, format, bound))


def _ln_check(x, weight, bias, eps, format, bound=0.0, op=LN_OP):
    check_layer_norm_args(x, weight, bias, op)
    check_format(op, format)
    check_bound(op, format, bound)


def _ln_supports(x, weight, bias, eps, format, bound=0.0) -> list[str]:
    return kernel_reasons(x.device, layer_norm_input_reasons(x, weight, bias) + _sixteen_bit(x),
                          lambda: _ext._C.layer_norm_check(*_args(x, x, weight, bias, eps), x.device.index,
                                                           **_quantized_args(None, None, format, bound)))


def layer_norm_quantize_rows_kernel(x, weight, bias, eps, format, bound=0.0, out=None):
    """The HIP kernel itself, no dispatch; `out`: (y, q, scale) to write into."""
    y, q, scale = (torch.empty_like(x), *quantized_like(x, format)) if out is None else out
    _ext._C.layer_norm_forward(*_args(x, y, weight, bias, eps), stream_handle(x.device), x.device.index,
                               **_quantized_args(q, scale, format, bound))
    return y, q, scale


def _ln_torch_path(x, weight, bias, eps, format, bound=0.0):
    y = _torch_layer_norm(x, weight, bias, eps)
    return (y, *quantize_rows_ref(y, format, bound))


def _ln_fake(x, weight, bias, eps, format, bound=0.0):
    _ln_check(x, weight, bias, eps, format, bound)
    return (torch.empty_like(x, memory_format=torch.contiguous_format), *quantized_like(x, format))


def _ln_plan_key(x, weight, bias, eps, format, bound=0.0):
    return tensor_key(x), tensor_key(weight), tensor_key(bias), format, bound


def _ln_key(op, x, weight, bias, eps, format, bound=0.0):
    return _key(op, x, format, bound, x.shape[-1], affine=int(weight is not None))


LN_SPEC = OpSpec(LN_OP, reference=layer_norm_quantize_rows_ref, check_args=_ln_check, fake=_ln_fake,
                 supports=_ln_supports, launch=lambda plan, *args: layer_norm_quantize_rows_kernel(*args),
                 torch_path=_ln_torch_path,
                 plan_key=_ln_plan_key, key=functools.partial(_ln_key, LN_OP),
                 candidates=lambda *args: {dispatch.TORCH: _ln_torch_path, "rocm_sd": layer_norm_quantize_rows_kernel},
                 samples=lambda device, dtype: _with_format(_layer_norm_samples(device, dtype)),
                 kernel=layer_norm_quantize_rows_kernel)


@LN_SPEC.define
def layer_norm_quantize_rows(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                             format: str, bound: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, q, scale): y = layer_norm(x) over the last dimension, and y quantized per row into `format` (with a bound
    > 0, one scale for every row: bound / fmax)."""


# ---- add_layer_norm_quantize_rows --------------------------------------------------------------------------

ADD_OP = "add_layer_norm_quantize_rows"


def add_layer_norm_quantize_rows_ref(x, residual, weight, bias, eps, format, bound=0.0):
    total, y = add_layer_norm_ref(x, residual, weight, bias, eps)
    return (total, y, *quantize_rows_ref(y, format, bound))


def _add_check(x, residual, weight, bias, eps, format, bound=0.0, op=ADD_OP):
    check_add_args(x, residual, weight, bias)
    check_format(op, format)
    check_bound(op, format, bound)


def _add_supports(x, residual, weight, bias, eps, format, bound=0.0) -> list[str]:
    reasons = layer_norm_input_reasons(x, weight, bias) + _residual_reasons(x, residual) + _sixteen_bit(x)
    return kernel_reasons(x.device, reasons,
                          lambda: _ext._C.layer_norm_check(*_args(x, x, weight, bias, eps), x.device.index,
                                                           **_residual_args(residual, x),
                                                           **_quantized_args(None, None, format, bound)))


def add_layer_norm_quantize_rows_kernel(x, residual, weight, bias, eps, format, bound=0.0, out=None):
    """The HIP kernel itself, no dispatch; `out`: (sum, y, q, scale) to write into."""
    total, y, q, scale = ((torch.empty_like(x), torch.empty_like(x), *quantized_like(x, format)) if out is None
                          else out)
    _ext._C.layer_norm_forward(*_args(x, y, weight, bias, eps), stream_handle(x.device), x.device.index,
                               **_residual_args(residual, total), **_quantized_args(q, scale, format, bound))
    return total, y, q, scale


def _add_torch_path_quantized(x, residual, weight, bias, eps, format, bound=0.0):
    total, y = _add_torch_path(x, residual, weight, bias, eps)
    return (total, y, *quantize_rows_ref(y, format, bound))


def _add_fake(x, residual, weight, bias, eps, format, bound=0.0, op=ADD_OP):
    dtype = check_add_args(x, residual, weight, bias)
    check_format(op, format)
    check_bound(op, format, bound)
    like = torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)
    return (like, torch.empty_like(like), *quantized_like(like, format))


def _add_plan_key(x, residual, weight, bias, eps, format, bound=0.0):
    return tensor_key(x), tensor_key(residual), tensor_key(weight), tensor_key(bias), format, bound


def _add_key(op, x, residual, weight, bias, eps, format, bound=0.0):
    return _key(op, x, format, bound, x.shape[-1], affine=int(weight is not None))


ADD_SPEC = OpSpec(ADD_OP, reference=add_layer_norm_quantize_rows_ref, check_args=_add_check, fake=_add_fake,
                  supports=_add_supports, launch=lambda plan, *args: add_layer_norm_quantize_rows_kernel(*args),
                  torch_path=_add_torch_path_quantized,
                  plan_key=_add_plan_key, key=functools.partial(_add_key, ADD_OP),
                  candidates=lambda *args: {dispatch.TORCH: _add_torch_path_quantized,
                                            "rocm_sd": add_layer_norm_quantize_rows_kernel},
                  samples=lambda device, dtype: _with_format([(x, torch.randn_like(x), w, b, eps)
                                                              for x, w, b, eps in _layer_norm_samples(device, dtype)]),
                  kernel=add_layer_norm_quantize_rows_kernel)


@ADD_SPEC.define
def add_layer_norm_quantize_rows(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                                 bias: torch.Tensor | None, eps: float, format: str,
                                 bound: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x + residual, y, q, scale): y = layer_norm(x + residual), and y quantized per row into `format` (with a bound
    > 0, one scale for every row)."""


# ---- layer_norm_quantized, add_layer_norm_quantized: the same rows without y ------------------------------------

LN_QUANTIZED_OP = "layer_norm_quantized"
ADD_QUANTIZED_OP = "add_layer_norm_quantized"


def _without_norm_y(x, weight, bias, eps) -> tuple:
    """layer_norm's kernel arguments with no y: only q and scale (and the sum) are written."""
    x_ptr, _, *rest = _args(x, x, weight, bias, eps)
    return (x_ptr, 0, *rest)


def layer_norm_quantized_ref(x, weight, bias, eps, format, bound=0.0):
    return layer_norm_quantize_rows_ref(x, weight, bias, eps, format, bound)[1:]


_ln_quantized_check = functools.partial(_ln_check, op=LN_QUANTIZED_OP)


def _ln_quantized_supports(x, weight, bias, eps, format, bound=0.0) -> list[str]:
    return kernel_reasons(x.device, layer_norm_input_reasons(x, weight, bias) + _sixteen_bit(x),
                          lambda: _ext._C.layer_norm_check(*_without_norm_y(x, weight, bias, eps), x.device.index,
                                                           **_quantized_args(None, None, format, bound)))


def layer_norm_quantized_kernel(x, weight, bias, eps, format, bound=0.0, out=None):
    """The HIP kernel itself, no dispatch; `out`: (q, scale) to write into."""
    q, scale = quantized_like(x, format) if out is None else out
    _ext._C.layer_norm_forward(*_without_norm_y(x, weight, bias, eps), stream_handle(x.device), x.device.index,
                               **_quantized_args(q, scale, format, bound))
    return q, scale


def _ln_quantized_torch_path(x, weight, bias, eps, format, bound=0.0):
    return _ln_torch_path(x, weight, bias, eps, format, bound)[1:]


def _ln_quantized_fake(x, weight, bias, eps, format, bound=0.0):
    _ln_quantized_check(x, weight, bias, eps, format, bound)
    return quantized_like(x, format)


LN_QUANTIZED_SPEC = OpSpec(
    LN_QUANTIZED_OP, reference=layer_norm_quantized_ref, check_args=_ln_quantized_check, fake=_ln_quantized_fake,
    supports=_ln_quantized_supports, launch=lambda plan, *args: layer_norm_quantized_kernel(*args),
    torch_path=_ln_quantized_torch_path,
    plan_key=_ln_plan_key, key=functools.partial(_ln_key, LN_QUANTIZED_OP),
    candidates=lambda *args: {dispatch.TORCH: _ln_quantized_torch_path, "rocm_sd": layer_norm_quantized_kernel},
    samples=lambda device, dtype: _with_format(_layer_norm_samples(device, dtype)), kernel=layer_norm_quantized_kernel)


@LN_QUANTIZED_SPEC.define
def layer_norm_quantized(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                         format: str, bound: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): layer_norm(x) over the last dimension quantized per row into `format` (with a bound > 0, one scale
    for every row), the normalized rows themselves not kept."""


def add_layer_norm_quantized_ref(x, residual, weight, bias, eps, format, bound=0.0):
    total, _, q, scale = add_layer_norm_quantize_rows_ref(x, residual, weight, bias, eps, format, bound)
    return total, q, scale


_add_quantized_check = functools.partial(_add_check, op=ADD_QUANTIZED_OP)


def _add_quantized_supports(x, residual, weight, bias, eps, format, bound=0.0) -> list[str]:
    reasons = layer_norm_input_reasons(x, weight, bias) + _residual_reasons(x, residual) + _sixteen_bit(x)
    return kernel_reasons(x.device, reasons,
                          lambda: _ext._C.layer_norm_check(*_without_norm_y(x, weight, bias, eps), x.device.index,
                                                           **_residual_args(residual, x),
                                                           **_quantized_args(None, None, format, bound)))


def add_layer_norm_quantized_kernel(x, residual, weight, bias, eps, format, bound=0.0, out=None):
    """The HIP kernel itself, no dispatch; `out`: (sum, q, scale) to write into."""
    total, q, scale = (torch.empty_like(x), *quantized_like(x, format)) if out is None else out
    _ext._C.layer_norm_forward(*_without_norm_y(x, weight, bias, eps), stream_handle(x.device), x.device.index,
                               **_residual_args(residual, total), **_quantized_args(q, scale, format, bound))
    return total, q, scale


def _add_quantized_torch_path(x, residual, weight, bias, eps, format, bound=0.0):
    total, _, q, scale = _add_torch_path_quantized(x, residual, weight, bias, eps, format, bound)
    return total, q, scale


def _add_quantized_fake(x, residual, weight, bias, eps, format, bound=0.0):
    total, _, q, scale = _add_fake(x, residual, weight, bias, eps, format, bound, op=ADD_QUANTIZED_OP)
    return total, q, scale


ADD_QUANTIZED_SPEC = OpSpec(
    ADD_QUANTIZED_OP, reference=add_layer_norm_quantized_ref, check_args=_add_quantized_check,
    fake=_add_quantized_fake, supports=_add_quantized_supports,
    launch=lambda plan, *args: add_layer_norm_quantized_kernel(*args), torch_path=_add_quantized_torch_path,
    plan_key=_add_plan_key, key=functools.partial(_add_key, ADD_QUANTIZED_OP),
    candidates=lambda *args: {dispatch.TORCH: _add_quantized_torch_path, "rocm_sd": add_layer_norm_quantized_kernel},
    samples=ADD_SPEC.samples, kernel=add_layer_norm_quantized_kernel)


@ADD_QUANTIZED_SPEC.define
def add_layer_norm_quantized(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                             bias: torch.Tensor | None, eps: float, format: str,
                             bound: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x + residual, q, scale): layer_norm(x + residual) quantized per row into `format` (with a bound > 0, one scale
    for every row), the normalized rows themselves not kept."""


# ---- geglu_quantize_rows -----------------------------------------------------------------------------------

GEGLU_OP = "geglu_quantize_rows"


def geglu_quantize_rows_ref(x, format, bound=0.0):
    y = geglu_ref(x)
    return (y, *quantize_rows_ref(y, format, bound))


def _geglu_check(x, format, bound=0.0, op=GEGLU_OP):
    check_geglu_args(x)
    check_format(op, format)
    check_bound(op, format, bound)


def _geglu_supports(x, format, bound=0.0, with_y=True) -> list[str]:
    """geglu_quantize_rows' reasons, or geglu_quantized's (`with_y` False: the kernel writes no y)."""
    return kernel_reasons(x.device, geglu_input_reasons(x) + _sixteen_bit(x),
                          lambda: _ext._C.geglu_check(*(_geglu_args(x, x) if with_y else _without_y(x)),
                                                      x.device.index, **_quantized_args(None, None, format, bound)))


def geglu_quantize_rows_kernel(x, format, bound=0.0, out=None):
    """The HIP kernel itself, no dispatch; `out`: (y, q, scale) to write into."""
    if out is None:
        y = _geglu_output(x)
        out = (y, *quantized_like(y, format))
    y, q, scale = out
    _ext._C.geglu_forward(*_geglu_args(x, y), stream_handle(x.device), x.device.index,
                          **_quantized_args(q, scale, format, bound))
    return y, q, scale


def _geglu_torch_path(x, format, bound=0.0):
    y = geglu_ref(x).contiguous()
    return (y, *quantize_rows_ref(y, format, bound))


def _geglu_fake(x, format, bound=0.0):
    _geglu_check(x, format, bound)
    y = _geglu_output(x)
    return (y, *quantized_like(y, format))


def _geglu_samples(device, dtype) -> list[tuple]:
    """Half-widths 64 (8-wide vectors), 7 (the scalar path) and 640 (rows longer than one pass of a wave)."""
    return _with_format([(torch.randn(2, 16, 2 * d, device=device, dtype=dtype),) for d in (64, 7, 640)])


GEGLU_SPEC = OpSpec(GEGLU_OP, reference=geglu_quantize_rows_ref, check_args=_geglu_check, fake=_geglu_fake,
                    supports=_geglu_supports, launch=lambda plan, *args: geglu_quantize_rows_kernel(*args),
                    torch_path=_geglu_torch_path,
                    plan_key=lambda x, format, bound=0.0: (tensor_key(x), format, bound),
                    key=lambda x, format, bound=0.0: _key(GEGLU_OP, x, format, bound, x.shape[-1] // 2),
                    candidates=lambda *args: {dispatch.TORCH: _geglu_torch_path,
                                              "rocm_sd": geglu_quantize_rows_kernel},
                    samples=_geglu_samples, kernel=geglu_quantize_rows_kernel)


@GEGLU_SPEC.define
def geglu_quantize_rows(x: torch.Tensor, format: str,
                        bound: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, q, scale): y = x[..., :D] * gelu(x[..., D:]), and y quantized per row into `format` (with a bound > 0, one
    scale for every row)."""


# ---- geglu_quantized ---------------------------------------------------------------------------------------

GEGLU_QUANTIZED_OP = "geglu_quantized"


def geglu_quantized_ref(x, format, bound=0.0):
    return quantize_rows_ref(geglu_ref(x), format, bound)


def _half(x: torch.Tensor) -> torch.Tensor:
    """A view shaped as the GEGLU's output (nothing allocated): what the quantized output is shaped like."""
    return x[..., : x.shape[-1] // 2]


def _without_y(x: torch.Tensor) -> tuple:
    """The kernel's arguments with no y: only q and scale are written."""
    x_ptr, _, *rest = _geglu_args(x, x)
    return (x_ptr, 0, *rest)


_geglu_quantized_check = functools.partial(_geglu_check, op=GEGLU_QUANTIZED_OP)


def geglu_quantized_kernel(x, format, bound=0.0, out=None):
    """The HIP kernel itself, no dispatch; `out`: (q, scale) to write into."""
    q, scale = quantized_like(_half(x), format) if out is None else out
    _ext._C.geglu_forward(*_without_y(x), stream_handle(x.device), x.device.index,
                          **_quantized_args(q, scale, format, bound))
    return q, scale


def _geglu_quantized_torch_path(x, format, bound=0.0):
    return _geglu_torch_path(x, format, bound)[1:]


def _geglu_quantized_fake(x, format, bound=0.0):
    _geglu_quantized_check(x, format, bound)
    return quantized_like(_half(x), format)


GEGLU_QUANTIZED_SPEC = OpSpec(
    GEGLU_QUANTIZED_OP, reference=geglu_quantized_ref, check_args=_geglu_quantized_check, fake=_geglu_quantized_fake,
    supports=functools.partial(_geglu_supports, with_y=False), launch=lambda plan, *args: geglu_quantized_kernel(*args),
    torch_path=_geglu_quantized_torch_path, plan_key=lambda x, format, bound=0.0: (tensor_key(x), format, bound),
    key=lambda x, format, bound=0.0: _key(GEGLU_QUANTIZED_OP, x, format, bound, x.shape[-1] // 2),
    candidates=lambda *args: {dispatch.TORCH: _geglu_quantized_torch_path, "rocm_sd": geglu_quantized_kernel},
    samples=_geglu_samples, kernel=geglu_quantized_kernel)


@GEGLU_QUANTIZED_SPEC.define
def geglu_quantized(x: torch.Tensor, format: str, bound: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): x[..., :D] * gelu(x[..., D:]) quantized per row into `format` (with a bound > 0, one scale for every
    row), the product itself not kept."""
