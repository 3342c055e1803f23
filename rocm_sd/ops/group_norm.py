"""rocm_sd::group_norm: GroupNorm with an optional fused SiLU (hip/group_norm/group_norm.hip).

    y = silu?((x - mean[n, g]) / sqrt(var[n, g] + eps) * weight[c] + bias[c])

x is (N, C, *spatial), NCHW-contiguous or channels-innermost (4-D channels_last, or 3-D (N, C, L) with
strides (L*C, 1, C)); the output keeps x's layout.
Statistics are computed in fp32 whatever the input dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _ext, dispatch
from ._checks import check_floating, check_min_dims, check_norm_params, check_same_device, fail
from ._common import (DTYPE_CODES, NHWC, ck_listing, dtype_reasons, into_output, layout_of, output_like, param_reasons,
                      stream_handle)
from .spec import (OpSpec, Plan, as_meta, device_of, dtype_name, kernel_reasons, layout_name, problem_key,
                   spatial_size, tensor_key)

OP = "group_norm"
# Codes of rsd::GroupNormPath (api.h): "auto" lets the kernel choose; the others exist for tests and
# benchmarks that must exercise or compare one path.
PATHS = {"auto": 0, "resident": 1, "split": 2}


def group_norm_ref(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float, silu: bool, input_bias: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch's GroupNorm (+ SiLU), exactly what an unpatched diffusers model computes (with `input_bias`,
    of shape (N, C), added to x first, as ResnetBlock2D adds its time embedding); called on float64
    inputs it is the truth the kernel is tested against. Differentiable."""
    if input_bias is not None:
        x = x + input_bias.reshape(input_bias.shape + (1,) * (x.dim() - 2))
    y = F.group_norm(x, num_groups, weight, bias, eps)
    if silu:
        y = F.silu(y)
    return y


def check_args(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
               input_bias: torch.Tensor | None) -> None:
    """Raises what PyTorch's GroupNorm would raise for these arguments (ops/_checks.py)."""
    check_floating(OP, input=x, input_bias=input_bias)
    check_min_dims(OP, x, 2, "(N, C, ...)")
    if num_groups <= 0 or x.shape[1] % num_groups:
        fail(OP, f"expected the number of channels ({x.shape[1]}) to be divisible by num_groups ({num_groups})")
    check_norm_params(OP, x, weight, bias, x.shape[1])
    check_same_device(OP, x, input_bias=input_bias)
    if input_bias is not None and tuple(input_bias.shape) != tuple(x.shape[:2]):
        fail(OP, f"input_bias of shape {tuple(input_bias.shape)} is not (N, C) = {tuple(x.shape[:2])}")
    if input_bias is not None and input_bias.dtype != x.dtype:  # x + input_bias would change the normalised dtype
        fail(OP, f"input_bias dtype {input_bias.dtype} differs from the input's {x.dtype}")


def input_reasons(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None) -> list[str]:
    """Reasons in the arguments themselves that the kernel cannot take (no GPU needed to ask)."""
    reasons = dtype_reasons(x.dtype)
    if x.dim() < 2:
        reasons.append(f"input has {x.dim()} dims, needs (N, C, ...)")
    elif num_groups <= 0 or x.shape[1] % num_groups:
        reasons.append(f"{x.shape[1]} channels not divisible by {num_groups} groups")
    if x.numel() == 0:
        reasons.append("empty tensor")
    if layout_of(x) is None:
        reasons.append(f"strides {tuple(x.stride())} are neither contiguous nor channels_last")
    return reasons + param_reasons(x, weight, bias, x.shape[1] if x.dim() > 1 else None)


def _input_bias_reasons(x: torch.Tensor, input_bias: torch.Tensor | None) -> list[str]:
    if input_bias is None:
        return []
    expected = tuple(x.shape[:2])
    reasons = []
    if tuple(input_bias.shape) != expected or not input_bias.is_contiguous():
        reasons.append(f"input_bias of shape {tuple(input_bias.shape)} is not a contiguous {expected} tensor")
    if input_bias.dtype != x.dtype:
        reasons.append(f"input_bias dtype {input_bias.dtype} differs from the input's {x.dtype}")
    if input_bias.device != x.device:
        reasons.append(f"input_bias on {input_bias.device}, input on {x.device}")
    return reasons


def supports(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
             eps: float, silu: bool, input_bias: torch.Tensor | None = None) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x, num_groups, weight, bias) + _input_bias_reasons(x, input_bias),
                          lambda: _ext._C.group_norm_check(*_kernel_args(x, x, num_groups, weight, bias, eps, silu)))


def _kernel_args(x, y, num_groups, weight, bias, eps, silu):
    params = weight if weight is not None else bias
    n, c = x.shape[0], x.shape[1]
    return (x.data_ptr(), y.data_ptr(), weight.data_ptr() if weight is not None else 0,
            bias.data_ptr() if bias is not None else 0, DTYPE_CODES[x.dtype],
            DTYPE_CODES[params.dtype] if params is not None else DTYPE_CODES[x.dtype], layout_of(x), n, c,
            x.numel() // (n * c), num_groups, float(eps), bool(silu), x.device.index)


def _shape_args(x, y, num_groups, path):
    n, c = x.shape[0], x.shape[1]
    return (x.data_ptr(), y.data_ptr(), DTYPE_CODES[x.dtype], layout_of(x), n, c, x.numel() // (n * c), num_groups,
            x.device.index, PATHS[path])


def _workspace_bytes(x, y, num_groups, path="auto") -> int:
    return _ext._C.group_norm_workspace_bytes(*_shape_args(x, y, num_groups, path))


def describe(x: torch.Tensor, num_groups: int, path: str = "auto") -> str:
    """Which kernels run for x, e.g. 'resident vec=8 blocks_per_group=128' (GPU build only)."""
    return _ext._C.group_norm_describe(*_shape_args(x, x, num_groups, path))


def group_norm_kernel(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      eps: float, silu: bool, out: torch.Tensor | None = None,
                      workspace_bytes: int | None = None, path: str = "auto",
                      input_bias: torch.Tensor | None = None) -> torch.Tensor:
    """The HIP kernel itself, no dispatch (tests call it with a poisoned `out` and a forced `path`)."""
    y = output_like(x) if out is None else out
    if workspace_bytes is None or out is not None:  # `out` may be less aligned than a fresh block
        workspace_bytes = _workspace_bytes(x, y, num_groups, path)
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=x.device)
    args = _kernel_args(x, y, num_groups, weight, bias, eps, silu)
    _ext._C.group_norm_forward(*args[:13], workspace.data_ptr(), stream_handle(x.device), x.device.index, PATHS[path],
                               input_bias.data_ptr() if input_bias is not None else 0)
    return y


def ck_instances(device: torch.device | None = None) -> list[tuple[str, bool]]:
    """(name, silu) of the Composable Kernel GroupNorm instances in this build (those with code for `device`'s
    GPU, given one): ROCm builds with CK headers only (ck_templates/); empty elsewhere."""
    return [tuple(i) for i in ck_listing("ck_group_norm_instances", device)]


def ck_reasons(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               input_bias: torch.Tensor | None) -> list[str]:
    """Why the CK instances cannot take this call: they take channels_last fp16 x with fp16 weight and bias."""
    reasons = []
    if x.dim() != 4 or layout_of(x) != NHWC:
        reasons.append("CK instances take 4-D channels_last input")
    if x.dtype != torch.float16 or any(p is None or p.dtype != torch.float16 for p in (weight, bias)):
        reasons.append("CK instances take fp16 input, weight and bias")
    if input_bias is not None:
        reasons.append("CK instances have no input bias")
    return reasons


def group_norm_ck(name: str, x: torch.Tensor, num_groups: int, weight: torch.Tensor, bias: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """One Composable Kernel instance, by name (`ck_instances()`); it raises when it cannot take the call."""
    y = output_like(x)
    n, c, h, w = x.shape
    _ext._C.ck_group_norm_forward(name, x.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr(), n, h, w, c,
                                  num_groups, eps, stream_handle(x.device), x.device.index)
    return y


def _plan(x, num_groups, weight, bias, eps, silu, input_bias) -> Plan:
    """Reasons against the kernel, the tuned choice, and as detail (kernel path or "ck:<instance>", workspace bytes
    for that path)."""
    reasons = supports(x, num_groups, weight, bias, eps, silu, input_bias)
    if reasons:
        return Plan(reasons)
    tuned = SPEC.tuned_choice(x, num_groups, weight, bias, eps, silu, input_bias)
    if (dispatch.ck_instance(tuned), silu) in ck_instances(x.device) and not ck_reasons(x, weight, bias, input_bias):
        return Plan(reasons, tuned, (tuned, None))  # the tuner measured this CK instance fastest here
    path = tuned.partition(":")[2] if tuned and tuned.startswith(dispatch.KERNEL + ":") else "auto"
    try:
        return Plan(reasons, tuned, (path, _workspace_bytes(x, x, num_groups, path)))
    except (RuntimeError, KeyError):  # a choice tuned at a nearby shape this path cannot take
        return Plan(reasons, tuned, ("auto", _workspace_bytes(x, x, num_groups)))


def _launch(plan: Plan, x, num_groups, weight, bias, eps, silu, input_bias):
    path, workspace_bytes = plan.detail
    ck = dispatch.ck_instance(path)
    if ck is not None:
        return group_norm_ck(ck, x, num_groups, weight, bias, eps)
    return group_norm_kernel(x, num_groups, weight, bias, eps, silu, workspace_bytes=workspace_bytes, path=path,
                             input_bias=input_bias)


def _torch_path(x, num_groups, weight, bias, eps, silu, input_bias=None):
    """The reference in x's dtype and layout, as the kernel's output; fp32 parameters with a 16-bit input (mixed
    precision) compute in fp32, as autocast would."""
    params = weight if weight is not None else bias
    if params is not None and params.dtype != x.dtype:
        return into_output(x, group_norm_ref(x.float(), num_groups, weight, bias, eps, silu, input_bias).to(x.dtype))
    return into_output(x, group_norm_ref(x, num_groups, weight, bias, eps, silu, input_bias))


def _fake(x, num_groups, weight, bias, eps, silu, input_bias=None):
    check_args(x, num_groups, weight, bias, input_bias)
    return output_like(x)


# The outputs come from the caching allocator, whose blocks are at least 16-byte aligned, so the output's
# alignment is not part of the plan's key.
def _plan_key(x, num_groups, weight, bias, eps, silu, input_bias):
    return tensor_key(x), num_groups, tensor_key(weight), tensor_key(bias), tensor_key(input_bias)


def _key(x, num_groups, weight, bias, eps, silu, input_bias=None) -> str:
    x, params = as_meta(x), as_meta(weight if weight is not None else bias)
    return problem_key(OP, dtype_name(x), layout_name(x), N=x.shape[0], C=x.shape[1], HW=spatial_size(x), G=num_groups,
                       act="silu" if silu else "none", input_bias=int(input_bias is not None),
                       params=dtype_name(params) if params is not None else "none")


def _candidates(x, num_groups, weight, bias, eps, silu, input_bias=None) -> dict:
    """PyTorch, the kernel's resident and split paths, and the CK instances that take the call (ROCm with CK)."""
    def kernel(path):
        return lambda *a: group_norm_kernel(*a[:6], path=path, input_bias=a[6] if len(a) > 6 else None)

    candidates = {dispatch.TORCH: group_norm_ref, "rocm_sd:resident": kernel("resident"), "rocm_sd:split": kernel("split")}
    if not ck_reasons(*(as_meta(a) for a in (x, weight, bias, input_bias))):
        for name, act_silu in ck_instances(device_of(x)):
            if act_silu == silu:
                candidates[f"{dispatch.CK}:{name}"] = lambda *a, _name=name: group_norm_ck(_name, *a[:4], a[4])
    return candidates


def _samples(device, dtype) -> list[tuple]:
    """32 groups of 64 channels at 8x8, NCHW and channels_last, with SiLU."""
    def args(memory_format):
        return (torch.randn(2, 64, 8, 8, device=device, dtype=dtype).to(memory_format=memory_format), 32,
                torch.rand(64, device=device, dtype=dtype), torch.randn(64, device=device, dtype=dtype), 1e-5, True)

    return [args(torch.contiguous_format), args(torch.channels_last)]


SPEC = OpSpec(OP, reference=group_norm_ref,
              check_args=lambda x, num_groups, weight, bias, eps, silu, input_bias=None:
                  check_args(x, num_groups, weight, bias, input_bias),
              fake=_fake, supports=supports, plan=_plan, launch=_launch, torch_path=_torch_path, plan_key=_plan_key,
              key=_key, candidates=_candidates, samples=_samples, kernel=group_norm_kernel, ck_instances=ck_instances)


@SPEC.define
def group_norm(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float, silu: bool, input_bias: torch.Tensor | None = None) -> torch.Tensor:
    """GroupNorm (+ SiLU) of x, with input_bias (N, C) added first: the module docstring's formula."""
