"""Tensor facts the op modules share: dtype codes of _C, layouts, output allocation, streams, parameter reasons,
the accuracy rule, CK listings."""
from __future__ import annotations

import torch

from .. import _ext

# Codes of rsd::DType and rsd::Layout in hip/include/rocm_sd/api.h.
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
NCHW, NHWC = 0, 1


def constant_under_compile(fn):
    """torch.compiler.assume_constant_result's mark (torch.compile treats a call of `fn` as a constant, not tracing
    into it), set without importing torch._dynamo: that import doubles the time and memory of `import rocm_sd` in
    every process that never compiles (a --help, an argument error). tests/test_imports.py checks that the mark is
    still the one torch sets."""
    fn._dynamo_marked_constant = True
    return fn


def dtype_reasons(dtype: torch.dtype) -> list[str]:
    """Why the elementwise / normalisation kernels cannot take `dtype` (they take every rsd::DType): [] or one reason."""
    return [] if dtype in DTYPE_CODES else [f"dtype {dtype} (supported: float16, bfloat16, float32)"]

# Accuracy rule shared by tests, benchmarks and the tuner (docs/design.md, convention 7, flash-attention's
# criterion): a kernel's max error against a float64 truth may be at most ERROR_FACTOR times the error
# of PyTorch's own op in the same precision, plus a rounding floor of the output dtype.
ERROR_FACTOR = 2.0
ROUNDING_FLOOR = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def layout_of(x: torch.Tensor) -> int | None:
    """NCHW for contiguous tensors; NHWC for channels-innermost ones: 4-D channels_last, and 3-D (N, C, L)
    with strides (L*C, 1, C) (any stride on a size-1 dim), which is what `.view(n, c, h*w)` of a
    channels_last activation gives (the VAE attention's GroupNorm); None for other strides."""
    if x.is_contiguous():
        return NCHW
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return NHWC
    if x.dim() == 3 and x.transpose(1, 2).is_contiguous():  # strides of size-1 dims do not matter
        return NHWC
    return None


def output_like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised tensor in x's layout (channels-innermost stays so, with x's strides), of x's dtype unless
    `dtype` says."""
    if layout_of(x) == NHWC:
        if x.dim() == 4:
            return torch.empty_like(x, dtype=dtype, memory_format=torch.channels_last)
        return torch.empty_like(x, dtype=dtype)
    return torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)


def into_output(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A PyTorch path's result `y` as output_like(x, dtype) lays it out, which is what the op's kernel and fake
    kernel return: copied only where it is not that already."""
    if layout_of(x) != NHWC and y.dtype == (dtype or x.dtype) and y.is_contiguous():
        return y
    return output_like(x, dtype).copy_(y)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: torch.device) -> int:
    """The current stream of `device` as an integer handle (the fast private accessor when torch has it:
    torch.cuda.current_stream builds a Stream object per call, a measurable cost at ~1000 calls a step)."""
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def param_reasons(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                  channels: int | None) -> list[str]:
    """Why affine parameters cannot go to a norm kernel: each must be a contiguous (channels,) vector on
    x's device, of x's dtype or float32, and both of one dtype."""
    reasons = []
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if p.device != x.device:
            reasons.append(f"{name} on {p.device}, input on {x.device}")
        if p.dtype not in (x.dtype, torch.float32):
            reasons.append(f"{name} dtype {p.dtype} is neither the input's ({x.dtype}) nor float32")
        if p.dim() != 1 or p.shape[0] != channels or not p.is_contiguous():
            reasons.append(f"{name} of shape {tuple(p.shape)} is not a contiguous ({channels},) vector")
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        reasons.append(f"weight dtype {weight.dtype} differs from bias dtype {bias.dtype}")
    return reasons


def within_tolerance(out, truth, torch_same_dtype, factor: float = ERROR_FACTOR) -> tuple[bool, float, float]:
    """(ok, error of out, allowed error): out may miss the truth by ERROR_FACTOR x torch's own error + floor.
    NaN in out where the truth has none is never within tolerance. Ops with several outputs pass tuples:
    each output is judged on its own; the result is the first failing one's (else the worst error's)."""
    if isinstance(out, (tuple, list)):
        results = [within_tolerance(o, t, s, factor) for o, t, s in zip(out, truth, torch_same_dtype, strict=True)]
        failing = [r for r in results if not r[0]]
        return failing[0] if failing else max(results, key=lambda r: r[1])
    truth = truth.double()
    if not torch.equal(torch.isnan(out), torch.isnan(truth)):
        return False, float("nan"), 0.0
    mask = ~torch.isnan(truth)
    err = (out.double() - truth)[mask].abs().max().item() if mask.any() else 0.0
    torch_err = (torch_same_dtype.double() - truth)[mask].abs().max().item() if mask.any() else 0.0
    allowed = factor * torch_err + ROUNDING_FLOOR[out.dtype] * max(1.0, truth[mask].abs().max().item() if mask.any() else 1.0)
    return err <= allowed, err, allowed


def ck_listing(function: str, device: torch.device | None = None) -> list:
    """What _C's `function` (ck_group_norm_instances, ck_attention_instances) lists: the Composable Kernel
    instances of ROCm builds with CK headers (ck_templates/); empty without them or without _C. For a GPU
    `device`, those with code for its arch (XDL instances on CDNA, WMMA ones on RDNA3/4); else all in the build."""
    listing = getattr(_ext._C, function, None) if _ext._C is not None else None
    if listing is None:
        return []
    from .. import platform

    return list(listing(platform.device_arch(device) if device is not None and device.type == "cuda" else ""))
