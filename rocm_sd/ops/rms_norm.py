"""rocm_sd::rms_norm: RMSNorm of attention heads, joined with the text stream and rotated (hip/rms_norm/rms_norm.hip).

    y = rms(x, weight)                                        x: (B, L, H, D), any strides with stride(-1) == 1
    y = cat([rms(lead, lead_weight), rms(x, weight)], dim=1)  lead: (B, L0, H, D): joint attention's text rows first
    then, with cos, sin (L0 + L, D) float32: Flux's rotary embedding at the joint row index

SD3's and Flux's attention: norm_q / norm_k, norm_added_q / norm_added_k, the [text, image] concatenation and
apply_rotary_emb in one pass, writing the contiguous (B, L0 + L, H, D) the attention reads. T5's RMSNorm is the
same op on hidden.unsqueeze(2). The arithmetic is diffusers' (models/normalization.py RMSNorm, models/embeddings.py
apply_rotary_emb with use_real_unbind_dim=-1, sequence_dim=1); the kernel computes in fp32 and rounds once.
"""
from __future__ import annotations

import torch

from .. import _ext, dispatch
from ._checks import REDUCED_FLOATS, check_floating, check_same_device, fail
from ._common import DTYPE_CODES, dtype_reasons, stream_handle
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, layout_name, problem_key, tensor_key

OP = "rms_norm"


def _rms(t: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """diffusers' RMSNorm: statistics in float32 (float64 stays float64: the truth), the normalised rows cast to a
    16-bit weight's dtype before the product, else to the input's."""
    variance = t.to(torch.promote_types(t.dtype, torch.float32)).pow(2).mean(-1, keepdim=True)
    normed = t * torch.rsqrt(variance + eps)
    if w is None:
        return normed.to(t.dtype)
    if w.dtype in REDUCED_FLOATS:
        normed = normed.to(w.dtype)
    return normed * w


def _rotary(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' apply_rotary_emb(y, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=1)."""
    acc = torch.promote_types(y.dtype, torch.float32)
    cos, sin = cos[None, :, None, :].to(y.device), sin[None, :, None, :].to(y.device)
    real, imag = y.reshape(*y.shape[:-1], -1, 2).unbind(-1)
    rotated = torch.stack([-imag, real], dim=-1).flatten(3)
    return (y.to(acc) * cos + rotated.to(acc) * sin).to(y.dtype)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float, lead: torch.Tensor | None = None,
                 lead_weight: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                 sin: torch.Tensor | None = None) -> torch.Tensor:
    """What diffusers' attention processors compute, op for op; differentiable; on float64 inputs, the truth."""
    y = _rms(x, weight, eps)
    if lead is not None:
        y = torch.cat([_rms(lead, lead_weight, eps), y], dim=1)
    return _rotary(y, cos, sin) if cos is not None else y


def check_args(x, weight, eps, lead=None, lead_weight=None, cos=None, sin=None) -> None:
    """Raises what the reference's PyTorch ops would raise (and for weights that are no (D,) vector)."""
    check_floating(OP, input=x, weight=weight, lead=lead, lead_weight=lead_weight, cos=cos, sin=sin)
    check_same_device(OP, x, weight=weight, lead=lead, lead_weight=lead_weight)
    if x.dim() != 4:
        fail(OP, f"input of shape {tuple(x.shape)} has {x.dim()} dims, expected (B, L, H, D)")
    b, _, h, d = x.shape
    for name, w in (("weight", weight), ("lead_weight", lead_weight)):
        if w is not None and tuple(w.shape) != (d,):
            fail(OP, f"{name} of shape {tuple(w.shape)} is not a ({d},) vector")
    if lead is not None and (lead.dim() != 4 or lead.shape[0] != b or lead.shape[2:] != x.shape[2:]):
        fail(OP, f"lead of shape {tuple(lead.shape)} does not join the input's {tuple(x.shape)} along dim 1 "
                 f"(expected ({b}, L0, {h}, {d}))")
    if (cos is None) != (sin is None):
        fail(OP, "cos and sin come together")
    if cos is not None:
        rows = x.shape[1] + (lead.shape[1] if lead is not None else 0)
        if d % 2:
            fail(OP, f"the rotary embedding pairs channels: head dim {d} is odd")
        for name, t in (("cos", cos), ("sin", sin)):
            if t.dim() != 2 or t.shape[0] not in (1, rows) or t.shape[1] not in (1, d):
                fail(OP, f"{name} of shape {tuple(t.shape)} does not broadcast to ({rows}, {d})")


def _param_dtype(x, weight, lead_weight) -> torch.dtype:
    params = weight if weight is not None else lead_weight
    return params.dtype if params is not None else x.dtype


def input_reasons(x, weight, eps, lead=None, lead_weight=None, cos=None, sin=None) -> list[str]:
    reasons = dtype_reasons(x.dtype)
    b, l, h, d = x.shape
    rows = l + (lead.shape[1] if lead is not None else 0)
    if b * rows * h * d == 0:
        reasons.append("empty tensor")
    for name, t in (("input", x), ("lead", lead)):
        if t is not None and d > 1 and t.stride(-1) != 1:
            reasons.append(f"{name} strides {tuple(t.stride())}: the head dim is not dense")
    if lead is not None and lead.dtype != x.dtype:
        reasons.append(f"lead dtype {lead.dtype} differs from the input's {x.dtype}")
    for name, w in (("weight", weight), ("lead_weight", lead_weight)):
        if w is not None and w.dtype not in (x.dtype, torch.float32):
            reasons.append(f"{name} dtype {w.dtype} is neither the input's ({x.dtype}) nor float32")
        if w is not None and not w.is_contiguous():
            reasons.append(f"{name} is not contiguous")
    if weight is not None and lead_weight is not None and weight.dtype != lead_weight.dtype:
        reasons.append(f"weight dtype {weight.dtype} differs from lead_weight dtype {lead_weight.dtype}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t is not None and (t.dtype != torch.float32 or tuple(t.shape) != (rows, d) or not t.is_contiguous()
                              or t.device != x.device):
            reasons.append(f"{name} {tuple(t.shape)} {t.dtype} on {t.device} is not a contiguous float32 "
                           f"({rows}, {d}) table on the input's device")
    return reasons


def _strides(t: torch.Tensor | None) -> list[int]:
    """(batch, sequence, head) strides in elements; a size-1 dimension's is 0 (torch leaves it arbitrary, and the
    kernel's vector width must not depend on it)."""
    if t is None:
        return [0, 0, 0]
    return [s if n > 1 else 0 for n, s in zip(t.shape[:3], t.stride()[:3])]


def _ptr(t: torch.Tensor | None) -> int:
    return t.data_ptr() if t is not None else 0


def _args(x, weight, eps, lead, lead_weight, cos, sin, y):
    b, l, h, d = x.shape
    return (_ptr(x), _ptr(weight), _ptr(lead), _ptr(lead_weight), _ptr(cos), _ptr(sin), y.data_ptr(),
            DTYPE_CODES[x.dtype], DTYPE_CODES[_param_dtype(x, weight, lead_weight)],
            [b, l, lead.shape[1] if lead is not None else 0, h, d], _strides(x), _strides(lead), float(eps))


def _output(x, lead):
    b, l, h, d = x.shape
    return torch.empty((b, l + (lead.shape[1] if lead is not None else 0), h, d), dtype=x.dtype, device=x.device)


def supports(x, weight, eps, lead=None, lead_weight=None, cos=None, sin=None) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x, weight, eps, lead, lead_weight, cos, sin),
                          lambda: _ext._C.rms_norm_check(*_args(x, weight, eps, lead, lead_weight, cos, sin, x),
                                                         x.device.index))


def rms_norm_kernel(x, weight, eps, lead=None, lead_weight=None, cos=None, sin=None, out=None):
    """The HIP kernel itself, no dispatch."""
    y = _output(x, lead) if out is None else out
    _ext._C.rms_norm_forward(*_args(x, weight, eps, lead, lead_weight, cos, sin, y), stream_handle(x.device),
                             x.device.index)
    return y


def _torch_path(x, weight, eps, lead=None, lead_weight=None, cos=None, sin=None):
    """The reference in x's dtype, contiguous as the kernel's output (float32 weights with a 16-bit input, mixed
    precision, compute in float32 as diffusers does, then round once to x's dtype)."""
    return rms_norm_ref(x, weight, eps, lead, lead_weight, cos, sin).to(x.dtype).contiguous()


def _fake(x, weight, eps, lead=None, lead_weight=None, cos=None, sin=None):
    check_args(x, weight, eps, lead, lead_weight, cos, sin)
    return _output(x, lead)


def _key(x, weight, eps, lead=None, lead_weight=None, cos=None, sin=None) -> str:
    x, lead = as_meta(x), as_meta(lead)
    b, l, h, d = x.shape
    return problem_key(OP, dtype_name(x), layout_name(x), B=b, L0=lead.shape[1] if lead is not None else 0, L=l,
                       H=h, D=d, affine=int(weight is not None), rope=int(cos is not None))


def _plan_key(x, weight, eps, lead=None, lead_weight=None, cos=None, sin=None):
    return tuple(tensor_key(t) for t in (x, weight, lead, lead_weight, cos, sin))


def _samples(device, dtype) -> list[tuple]:
    """T5's form (one head of 96: the kernel's vectors), and the joint form with the rotary embedding on a view of
    a fused QKV projection (D 40: 8-wide vectors of 16-bit, 4-wide of float32), lead with its own weight."""
    t5 = (torch.randn(2, 8, 1, 96, device=device, dtype=dtype), torch.rand(96, device=device, dtype=dtype), 1e-6)
    qkv = torch.randn(2, 6, 3 * 3 * 40, device=device, dtype=dtype)
    x = qkv[..., :120].unflatten(-1, (3, 40))
    lead = torch.randn(2, 4, 3, 40, device=device, dtype=dtype)
    angles = torch.randn(10, 20, device=device).repeat_interleave(2, dim=1)
    joint = (x, torch.rand(40, device=device, dtype=dtype), 1e-6, lead, torch.rand(40, device=device, dtype=dtype),
             angles.cos(), angles.sin())
    return [t5, joint]


SPEC = OpSpec(OP, reference=rms_norm_ref, check_args=check_args, fake=_fake, supports=supports,
              launch=lambda plan, *args: rms_norm_kernel(*args), torch_path=_torch_path, plan_key=_plan_key, key=_key,
              candidates=lambda *args: {dispatch.TORCH: rms_norm_ref, "rocm_sd": rms_norm_kernel},
              samples=_samples, kernel=rms_norm_kernel)


@SPEC.define
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, lead: torch.Tensor | None = None,
             lead_weight: torch.Tensor | None = None, cos: torch.Tensor | None = None,
             sin: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x's heads (lead's rows first, with lead_weight), then the rotary embedding when cos, sin are given."""
