"""rocm_sd::linear_geglu: diffusers' GEGLU including its projection.

    y = h * gelu(g),  (h, g) = (x W^T + b).chunk(2, -1)      x: (..., K); W: (2N, K), nn.Linear's; b: (2N,)

The op exists for the Composable Kernel instances that fuse the epilogues into the GEMMs (ck_templates/
LinearGegluInstance: the gate's GELU into one GEMM, bias and product into the other), so the [..., 2N]
projection is never written. Its default path is what RocmGEGLU always ran, F.linear (cuBLAS / hipBLASLt)
then rocm_sd::geglu; a CK instance runs where the tuner measured it faster. RocmGEGLU routes through this op
only in builds that have CK instances (ROCm with CK headers), so other builds keep the GEMM visible to
torch.compile and skip a dispatch layer.
"""
from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F

from .. import _ext, dispatch
from ._checks import check_floating, check_same_device, fail
from ._common import ck_listing, constant_under_compile, stream_handle
from .geglu import geglu, geglu_ref
from .spec import OpSpec, as_meta, ck_hosted_plan, device_of, dtype_name, layout_name, problem_key, tensor_key

OP = "linear_geglu"


def linear_geglu_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """diffusers' GEGLU op for op (projection, chunk, exact gelu, product); differentiable."""
    return geglu_ref(F.linear(x, weight, bias))


def linear_geglu_composed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The default path: the vendor GEMM, then rocm_sd::geglu (which dispatches and counts itself)."""
    return geglu.call(F.linear(x, weight, bias))


@cache
def ck_instances(device: torch.device | None = None) -> tuple[str, ...]:
    """Names of the CK GEGLU-projection instances in this build (those with code for `device`'s GPU, given one):
    ROCm builds with CK headers only."""
    return tuple(ck_listing("ck_linear_geglu_instances", device))


@constant_under_compile  # asked inside patched forwards: torch.compile must not trace into _C
def hosts_ck() -> bool:
    """Whether this build has CK instances for the op (for any of its GPU targets): the patched modules route
    through it only then (on a GPU none of them is built for, the op runs its composed default)."""
    return bool(ck_instances())


def ck_reasons(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> list[str]:
    """Why the CK instances cannot take this call (no GPU needed to ask)."""
    reasons = []
    if any(t is None or t.dtype != torch.float16 for t in (x, weight, bias)):
        reasons.append("CK GEGLU instances take fp16 input, weight and bias")
    if x.dim() < 1 or not x.is_contiguous() or x.numel() == 0:
        reasons.append(f"input {tuple(x.shape)} is empty or not contiguous")
    if weight.dim() != 2 or not weight.is_contiguous() or weight.shape[0] % 2 or \
            (x.dim() and weight.shape[1] != x.shape[-1]):
        reasons.append(f"weight {tuple(weight.shape)} is not a contiguous (2N, K) matrix for input {tuple(x.shape)}")
    elif weight.shape[1] % 8 or (weight.shape[0] // 2) % 8:
        reasons.append("CK GEGLU instances read and write 8-element vectors: K and N must be multiples of 8")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0] or not bias.is_contiguous()):
        reasons.append(f"bias {tuple(bias.shape)} is not a contiguous vector of the weight's {weight.shape[0]} rows")
    return reasons


def check_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    """Raises what F.linear and the GEGLU split would raise (ops/_checks.py)."""
    check_floating(OP, input=x, weight=weight, bias=bias)
    check_same_device(OP, x, weight=weight, bias=bias)
    if x.dim() < 1 or weight.dim() != 2 or weight.shape[1] != x.shape[-1] or weight.shape[0] % 2:
        fail(OP, f"input {tuple(x.shape)} and weight {tuple(weight.shape)} are not (..., K) and (2N, K)")
    if tuple(bias.shape) != (weight.shape[0],):
        fail(OP, f"bias of shape {tuple(bias.shape)} is not a ({weight.shape[0]},) vector")
    if not x.dtype == weight.dtype == bias.dtype:
        fail(OP, f"expected input, weight and bias of one dtype, got {x.dtype}, {weight.dtype}, {bias.dtype}")


def _output(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[:-1] + (weight.shape[0] // 2,))


def linear_geglu_ck(name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One CK instance by name (`ck_instances()`); it raises when it cannot take the call."""
    out = _output(x, weight)
    k, n = x.shape[-1], weight.shape[0] // 2
    m = x.numel() // k
    gate = x.new_empty(m, n)  # the first GEMM's output, read by the second's epilogue
    _ext._C.ck_linear_geglu_forward(name, x.data_ptr(), weight.data_ptr(), bias.data_ptr(), gate.data_ptr(),
                                    out.data_ptr(), m, n, k, k, stream_handle(x.device), x.device.index)
    return out


def _plan(x, weight, bias):
    return ck_hosted_plan(SPEC, (x, weight, bias), ck_instances(x.device), lambda: ck_reasons(x, weight, bias))


def _launch(plan, x, weight, bias):
    if plan.detail is not None:
        return linear_geglu_ck(plan.detail, x, weight, bias)
    return linear_geglu_composed(x, weight, bias)


def _fake(x, weight, bias):
    check_args(x, weight, bias)
    return _output(x, weight)


def _key(x, weight, bias) -> str:
    x, w = as_meta(x), as_meta(weight)
    return problem_key(OP, dtype_name(x), layout_name(x), rows=x.numel() // max(x.shape[-1], 1), K=x.shape[-1],
                       N=w.shape[0] // 2)


def _candidates(x, weight, bias) -> dict:
    """PyTorch, the composed default, and each CK instance that takes the call."""
    candidates = {dispatch.TORCH: linear_geglu_ref, "rocm_sd": linear_geglu_composed}
    if not ck_reasons(*(as_meta(t) for t in (x, weight, bias))):
        for name in ck_instances(device_of(x)):
            candidates[f"{dispatch.CK}:{name}"] = lambda *a, _name=name: linear_geglu_ck(_name, *a)
    return candidates


def _samples(device, dtype) -> list[tuple]:
    """K 64 (CK's 8-wide vectors) and an odd K 33."""
    return [(torch.randn(2, 8, k, device=device, dtype=dtype), torch.randn(48, k, device=device, dtype=dtype),
             torch.randn(48, device=device, dtype=dtype)) for k in (64, 33)]


SPEC = OpSpec(OP, reference=linear_geglu_ref, check_args=check_args, fake=_fake,
              supports=lambda *args: [],  # the composed default runs every call (its epilogue op falls back itself)
              plan=_plan, launch=_launch, torch_path=lambda *args: linear_geglu_ref(*args).contiguous(),
              plan_key=lambda x, weight, bias: (tensor_key(x), tensor_key(weight), tensor_key(bias)), key=_key,
              candidates=_candidates, samples=_samples, ck_instances=ck_instances)


@SPEC.define
def linear_geglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GEGLU of x's projection (weight, bias: nn.Linear's, 2N outputs)."""
