"""rocm_sd::attention_fp8: attention with FP8 products (hip/attention_fp8/attention_fp8.hip), for
optimize(attention_precision="fp8").

    q8, qs = quantize_rows(q)                 per token and head (one scale per head_dim row)
    k8, ks = quantize_rows(k)
    v8, vs = quantize_rows(v over the keys)   per channel: P V reduces over keys, so V's scale must not vary along them
    p      = softmax(scale * (q8 qs) (k8 ks)^T)                        in fp32
    out    = (fp8(p * FMAX) v8) * vs / FMAX / sum(p)

q, k, v in rocm_sd::attention's layout ([batch, seq, heads, head_dim] views, any batch / sequence / head strides);
out contiguous [batch, q_len, heads, head_dim] in q's dtype. `format` is the device's FP8 (e4m3fnuz on gfx942,
e4m3fn on gfx950, gfx12 and NVIDIA sm_89+: ops/quantize.fp8_format).

The kernel quantizes each tile of probabilities against the running row maximum of its online softmax, not the
final one (as flash-attention's FP8 kernels do): its roundings differ from attention_fp8_ref's, with errors of the
same size. So the op is held to attention itself: the tuner accepts the kernel within FP8_ERROR of attention's
largest output magnitude (bench/bench_attention_fp8.py measures 4-10% at the SD shapes, where a layout or scaling
bug errs by the whole output).

Which runs: the tuning database's measured choice for the shape (`python -m rocm_sd.tune --ops attention_fp8` times
the FP8 kernel against the fp16 attention it replaces); untuned shapes, and devices without FP8 matrix instructions,
run the fp16 attention (rocm_sd::attention's PyTorch path), as rocm_sd::attention keeps SDPA where nothing was
measured. So the FP8 kernel runs only where it was measured faster, and where it runs it changes the result by its
quantization (attention_fp8_ref is that computation, in any precision).
"""
from __future__ import annotations

import torch

from .. import _ext, dispatch
from ._checks import fail
from ._common import DTYPE_CODES, stream_handle
from .attention import check_args as attention_check_args
from .attention import attention_ref, default_scale, scaled_dot_product_attention
from .attention import input_reasons as attention_input_reasons
from .quantize import FORMATS, check_format, quantize_rows_ref
from .spec import (OpSpec, Plan, PlanCache, as_meta, dispatcher_needed, dtype_name, kernel_reasons, problem_key,
                   tensor_key)

OP = "attention_fp8"
MAX_HEAD_DIM = 160  # kMaxHeadDim in hip/attention_fp8/attention_fp8.hip
FP8_FORMATS = ("e4m3fn", "e4m3fnuz")
FP8_ERROR = 0.2  # the tuner's tolerance, a part of the exact output's largest magnitude (module docstring)


def _dequantized(x: torch.Tensor, format: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes as `dtype`, scales as `dtype`) of x quantized per row of its last dim, as the kernel quantizes."""
    codes, scale = quantize_rows_ref(x, format)
    return codes.to(dtype), scale.to(dtype).unsqueeze(-1)


def attention_fp8_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, format: str) -> torch.Tensor:
    """The definition (module docstring), with the probabilities rounded once, against the final row maxima: the
    quantization of Q, K and V as the kernel does it (fp32, ops/quantize.py's rounding), the rest in float64 for
    float64 inputs, else in fp32."""
    _, fp8, fmax = FORMATS[format]
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    q8, qs = _dequantized(q, format, work)                    # [B, Lq, H, D], [B, Lq, H, 1]
    k8, ks = _dequantized(k, format, work)
    v8, vs = _dequantized(v.permute(0, 2, 3, 1), format, work)  # [B, H, D, Lk] rows over the keys
    logits = torch.einsum("bqhd,bkhd->bhqk", q8 * qs, k8 * ks) * scale
    p = torch.exp(logits - logits.amax(-1, keepdim=True))
    p8 = (p.float() * fmax).to(fp8).to(work)
    out = torch.einsum("bhqk,bhdk->bqhd", p8, v8) * vs.squeeze(-1).unsqueeze(1) / fmax
    return (out / p.sum(-1).transpose(1, 2).unsqueeze(-1)).to(q.dtype)


def check_args(q, k, v, scale, format) -> None:
    attention_check_args(q, k, v)
    check_format(OP, format)
    if format not in FP8_FORMATS:
        fail(OP, f"format {format!r} is not an FP8 format ({', '.join(FP8_FORMATS)})")


def input_reasons(q, k, v, scale, format) -> list[str]:
    reasons = attention_input_reasons(q, k, v, scale)
    if q.dim() == 4 and q.shape[-1] > MAX_HEAD_DIM:
        reasons.append(f"head dim {q.shape[-1]} > {MAX_HEAD_DIM} (the FP8 kernel's largest)")
    return reasons


def _strides(t: torch.Tensor) -> list[int]:
    return [t.stride(0), t.stride(1), t.stride(2)]


def _output(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.empty(q.shape[:3] + v.shape[3:], dtype=q.dtype, device=q.device)


def _kernel_args(q, k, v, out_ptr: int, out_strides: list[int], scale, format, workspace_ptr: int) -> tuple:
    sizes = [q.shape[0], q.shape[2], q.shape[1], k.shape[1], q.shape[3]]
    return (q.data_ptr(), k.data_ptr(), v.data_ptr(), out_ptr, DTYPE_CODES[q.dtype], sizes,
            [_strides(q), _strides(k), _strides(v), out_strides], float(scale), FORMATS[format][0], workspace_ptr)


def _query(name: str, q, k, v, scale, format):
    """attention_fp8_check / _describe / _workspace_bytes for the contiguous output and the workspace the op
    allocates (only their alignment is checked: q's pointer stands in for the output, 0 for the workspace)."""
    out_strides = [q.shape[1] * q.shape[2] * q.shape[3], q.shape[2] * q.shape[3], q.shape[3]]
    args = _kernel_args(q, k, v, q.data_ptr(), out_strides, scale, format, 0)
    return getattr(_ext._C, f"attention_fp8_{name}")(*args, q.device.index)


def supports(q, k, v, scale, format) -> list[str]:
    """Reasons the kernel cannot run this call (the device's FP8 included); empty when it can."""
    return kernel_reasons(q.device, input_reasons(q, k, v, scale, format), lambda: _query("check", q, k, v, scale, format))


def describe(q, k, v, scale, format) -> str:
    """The instance, format and grid the kernel would run for this call, or 'error: <why>'."""
    return _query("describe", q, k, v, scale, format)


def attention_fp8_kernel(q, k, v, scale, format, out: torch.Tensor | None = None,
                         workspace_bytes: int | None = None) -> torch.Tensor:
    """The HIP kernels themselves, no dispatch (tests call them with a poisoned `out`); the op passes the workspace
    size its plan asked once per shape."""
    y = _output(q, v) if out is None else out
    if workspace_bytes is None:
        workspace_bytes = _query("workspace_bytes", q, k, v, scale, format)
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device)
    _ext._C.attention_fp8_forward(*_kernel_args(q, k, v, y.data_ptr(), _strides(y), scale, format,
                                                workspace.data_ptr()), stream_handle(q.device), q.device.index)
    return y


def fp16_attention(q, k, v, scale, format) -> torch.Tensor:
    """What attention_fp8 replaces and approximates: the model's own attention (SDPA; float64 inputs: the truth),
    format unused."""
    return attention_ref(q, k, v, scale)


def _plan(q, k, v, scale, format) -> Plan:
    """Reasons against the kernel, the choice (the measured one, else the fp16 attention: module docstring) and as
    detail the kernel's workspace bytes."""
    reasons = supports(q, k, v, scale, format)
    return Plan(reasons, SPEC.tuned_choice(q, k, v, scale, format) or dispatch.TORCH,
                0 if reasons else _query("workspace_bytes", q, k, v, scale, format))


def _fake(q, k, v, scale, format):
    check_args(q, k, v, scale, format)
    return _output(q, v)


def _key(q, k, v, scale, format) -> str:
    q, k = as_meta(q), as_meta(k)
    return problem_key(OP, dtype_name(q), "bshd", format=format, B=q.shape[0], H=q.shape[2], Lq=q.shape[1],
                       Lk=k.shape[1], D=q.shape[3])


def _candidates(q, k, v, scale, format) -> dict:
    """The fp16 attention it replaces and the FP8 kernel."""
    return {dispatch.TORCH: fp16_attention, "rocm_sd": attention_fp8_kernel}


def _samples(device, dtype) -> list[tuple]:
    """Separate q, k, v of head dim 40 with 16 queries and 9 keys, and a packed QKV projection's per-head views."""
    separate = tuple(torch.randn(2, length, 2, 40, device=device, dtype=dtype) for length in (16, 9, 9))
    packed = tuple(torch.randn(2, 16, 3, 2, 64, device=device, dtype=dtype).unbind(2))
    return [separate + (0.125, "e4m3fn"), packed + (0.125, "e4m3fn")]


SPEC = OpSpec(OP, reference=fp16_attention, error_floor=FP8_ERROR, check_args=check_args, fake=_fake, supports=supports,
              plan=_plan,
              launch=lambda plan, *args: attention_fp8_kernel(*args, workspace_bytes=plan.detail),
              torch_path=fp16_attention,
              plan_key=lambda q, k, v, scale, format: (tensor_key(q), tensor_key(k), tensor_key(v), scale, format),
              key=_key, candidates=_candidates, samples=_samples, kernel=attention_fp8_kernel)


@SPEC.define
def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, format: str) -> torch.Tensor:
    """softmax(scale q k^T) v per batch and head with Q, K, V and the probabilities in FP8 `format`."""


_kernel_chosen = PlanCache()  # device -> whether its tuning database chose the FP8 kernel anywhere


def kernel_may_run(device: torch.device) -> bool:
    """Whether any attention_fp8 call on `device` could run the FP8 kernel: it is forced by name, or the tuning
    database chose it for some problem (its nearest-shape lookup may then pick it for other shapes too)."""
    forced = dispatch.forced_backend(OP)
    if forced is not None:
        return forced == dispatch.KERNEL
    return device.type == "cuda" and _kernel_chosen.get_or_compute(
        device, lambda: dispatch.chose_anywhere(device, OP, dispatch.KERNEL))


def fp8_call_uses_op(q: torch.Tensor) -> bool:
    """Whether an unmasked host call could go anywhere but the fp16 attention through this op: the FP8 kernel may
    run on q's device, or something watches the op. A host with its own attention function (ComfyUI) keeps it
    otherwise."""
    return dispatcher_needed() or kernel_may_run(q.device)


def scaled_dot_product_attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, format: str,
                                     scale: float | None = None) -> torch.Tensor:
    """The host apps' layout ([B, H, L, D] views, as F.scaled_dot_product_attention takes them, no mask) through the
    op on [B, L, H, D] views of the same memory; straight to the fp16 attention's host entry, counted as the op's
    torch path, where the op could only choose that (nothing tuned or forced the kernel, nothing watches the op):
    the op's plan and its output copy cost every attention call otherwise."""
    scale = scale if scale is not None else default_scale(q)
    if not fp8_call_uses_op(q):
        dispatch.count(OP, dispatch.TORCH)
        return scaled_dot_product_attention(q, k, v, None, scale)
    return attention_fp8.call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, format).transpose(1, 2)
