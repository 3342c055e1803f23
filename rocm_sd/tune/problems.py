"""What can be tuned per op: the problem key of a call (shared by the tuner and the dispatcher), the
candidates that compute it, and the float64 truth they are checked against.

Candidates are named `torch` (the op's PyTorch path at the call's dtype), `torch:<variant>` (attention: SDPA
restricted to one backend, flash / efficient / cudnn), `rocm_sd[:variant]` (the HIP
kernel, called directly, with a variant where the kernel family has several: GroupNorm's resident and
split paths) or `ck:<instance>` (a Composable Kernel instance built into _C on ROCm, ck_templates/).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .. import dispatch
from ..ops.attention import attention_ck, attention_kernel, attention_ref, attention_sdpa, sdpa_backends
from ..ops.attention import ck_instances as attention_ck_instances
from ..ops.attention import ck_reasons as attention_ck_reasons
from ..ops.attention import input_reasons as attention_input_reasons
from ..ops.attention import instance_fits as attention_instance_fits
from ..ops.attention import instances as attention_instances
from ..ops.attention import supports as attention_supports
from ..ops.bias_residual import bias_residual_kernel, bias_residual_ref
from ..ops.bias_residual import supports as bias_residual_supports
from ..ops.conv_bias_residual import ck_instances as conv_ck_instances
from ..ops.conv_bias_residual import ck_reasons as conv_ck_reasons
from ..ops.conv_bias_residual import conv_bias_residual_ck, conv_bias_residual_composed, conv_bias_residual_ref
from ..ops.linear_geglu import ck_instances as linear_geglu_ck_instances
from ..ops.linear_geglu import ck_reasons as linear_geglu_ck_reasons
from ..ops.linear_geglu import linear_geglu_ck, linear_geglu_composed, linear_geglu_ref
from ..ops.geglu import geglu_kernel, geglu_ref
from ..ops.geglu import supports as geglu_supports
from ..ops.group_norm import ck_instances, ck_reasons, group_norm_ck, group_norm_kernel, group_norm_ref
from ..ops.group_norm import supports as group_norm_supports
from ..ops.layer_norm import add_layer_norm_kernel, add_layer_norm_ref, add_layer_norm_supports
from ..ops.layer_norm import layer_norm_kernel, layer_norm_ref
from ..ops.layer_norm import supports as layer_norm_supports
from ..ops.parity_shuffle import parity_shuffle_kernel, parity_shuffle_ref
from ..ops.parity_shuffle import supports as parity_shuffle_supports
from ..ops._common import NHWC, layout_of
from .db import problem_key
from .harvest import OpCall, TensorSpec

TORCH = "torch"


def _meta(arg):
    """A tensor to ask shapes, strides and layout of, for a real argument or a recorded spec."""
    if isinstance(arg, TensorSpec):
        return torch.empty_strided(arg.shape, arg.stride, dtype=arg.dtype, device="meta")
    return arg


def _device(arg) -> torch.device | None:
    """The device of a real argument (the CK instances offered are those with code for its GPU's arch); None for
    a recorded spec (every instance in the build)."""
    return arg.device if isinstance(arg, torch.Tensor) else None


def _dtype(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def _layout(t) -> str:
    return {NHWC: "nhwc", None: "strided"}.get(layout_of(t), "nchw")


def _spatial(x) -> int:
    return x.numel() // (x.shape[0] * x.shape[1]) if x.dim() >= 2 and x.shape[0] * x.shape[1] else 0


def _double(args: tuple) -> tuple:
    return tuple(a.double() if isinstance(a, torch.Tensor) else a for a in args)


@dataclass(frozen=True)
class OpTuning:
    key: Callable[..., str]                       # (*args) -> problem key
    candidates: Callable[..., dict]               # (*args) -> {name: fn(*args) -> output}
    reference: Callable                           # the op's PyTorch reference (float64 truth, torch path)


# ---- group_norm(x, num_groups, weight, bias, eps, silu, input_bias=None) --------------------------------

def _group_norm_key(x, num_groups, weight, bias, eps, silu, input_bias=None) -> str:
    x, params = _meta(x), _meta(weight if weight is not None else bias)
    return problem_key("group_norm", _dtype(x), _layout(x), N=x.shape[0], C=x.shape[1], HW=_spatial(x), G=num_groups,
                       act="silu" if silu else "none", input_bias=int(input_bias is not None),
                       params=_dtype(params) if params is not None else "none")


def _group_norm_candidates(x, num_groups, weight, bias, eps, silu, input_bias=None) -> dict:
    def kernel(path):
        return lambda *a: group_norm_kernel(*a[:6], path=path, input_bias=a[6] if len(a) > 6 else None)

    candidates = {TORCH: group_norm_ref, "rocm_sd:resident": kernel("resident"), "rocm_sd:split": kernel("split")}
    meta = [_meta(a) for a in (x, weight, bias, input_bias)]
    if not ck_reasons(*meta):  # Composable Kernel instances (ROCm builds with CK only)
        for name, act_silu in ck_instances(_device(x)):
            if act_silu == silu:
                candidates[f"{dispatch.CK}:{name}"] = lambda *a, _name=name: group_norm_ck(_name, *a[:4], a[4])
    return candidates


# ---- the single-kernel ops ----------------------------------------------------------------------------

def _geglu_key(x) -> str:
    x = _meta(x)
    return problem_key("geglu", _dtype(x), _layout(x), rows=x.numel() // max(x.shape[-1], 1), D=x.shape[-1] // 2)


def _layer_norm_key(x, weight, bias, eps) -> str:
    x = _meta(x)
    return problem_key("layer_norm", _dtype(x), _layout(x), rows=x.numel() // max(x.shape[-1], 1), D=x.shape[-1],
                       affine=int(weight is not None))


def _add_layer_norm_key(x, residual, weight, bias, eps) -> str:
    return _layer_norm_key(x, weight, bias, eps).replace("layer_norm", "add_layer_norm", 1)


def _bias_residual_key(x, residual, bias, scale) -> str:
    x = _meta(x)
    return problem_key("bias_residual", _dtype(x), _layout(x), N=x.shape[0], C=x.shape[1], HW=_spatial(x))


def _parity_shuffle_key(parities, bias) -> str:
    p = _meta(parities)
    return problem_key("parity_shuffle", _dtype(p), _layout(p), N=p.shape[0], C=p.shape[1] // 4, H=p.shape[2] - 1,
                       W=p.shape[3] - 1, bias=int(bias is not None))


def _attention_key(q, k, v, scale) -> str:
    q, k = _meta(q), _meta(k)
    return problem_key("attention", _dtype(q), "bshd", B=q.shape[0], H=q.shape[2], Lq=q.shape[1], Lk=k.shape[1],
                       D=q.shape[3])


def _attention_candidates(q, k, v, scale) -> dict:
    """SDPA with its own backend pick, each SDPA backend on its own (one that cannot take the shape raises and is
    rejected), each compiled kernel instance that holds the head dim and dtype (block shapes differ), and each
    Composable Kernel instance (ROCm builds with CK only; fp16)."""
    candidates = {TORCH: attention_ref}
    for backend in sdpa_backends():
        candidates[f"{TORCH}:{backend}"] = lambda *a, _backend=backend: attention_sdpa(*a, _backend)
    meta = [_meta(t) for t in (q, k, v)]
    if not attention_input_reasons(*meta, scale):
        for name in attention_instances():
            if attention_instance_fits(name, meta[0].dtype, meta[0].shape[-1]):
                candidates[f"rocm_sd:{name}"] = lambda *a, _name=name: attention_kernel(*a, instance=_name)
    if not attention_ck_reasons(*meta, scale):
        for name in attention_ck_instances(_device(q)):
            candidates[f"{dispatch.CK}:{name}"] = lambda *a, _name=name: attention_ck(_name, *a)
    return candidates


# ---- the ops that host CK fusions: their default path (vendor GEMM / convolution, then a rocm_sd epilogue
# op) against the PyTorch path and each CK instance that takes the call -------------------------------------

def _linear_geglu_key(x, weight, bias) -> str:
    x, w = _meta(x), _meta(weight)
    return problem_key("linear_geglu", _dtype(x), _layout(x), rows=x.numel() // max(x.shape[-1], 1), K=x.shape[-1],
                       N=w.shape[0] // 2)


def _linear_geglu_candidates(x, weight, bias) -> dict:
    candidates = {TORCH: linear_geglu_ref, "rocm_sd": linear_geglu_composed}
    if not linear_geglu_ck_reasons(*[_meta(t) for t in (x, weight, bias)]):
        for name in linear_geglu_ck_instances(_device(x)):
            candidates[f"{dispatch.CK}:{name}"] = lambda *a, _name=name: linear_geglu_ck(_name, *a)
    return candidates


def _conv_bias_residual_key(x, weight, bias, residual, scale, pad_h, pad_w) -> str:
    x, w = _meta(x), _meta(weight)
    return problem_key("conv_bias_residual", _dtype(x), _layout(x), N=x.shape[0], C=x.shape[1], H=x.shape[2],
                       W=x.shape[3], K=w.shape[0], R=w.shape[2], S=w.shape[3], pad=f"{pad_h}x{pad_w}")


def _conv_bias_residual_candidates(x, weight, bias, residual, scale, pad_h, pad_w) -> dict:
    candidates = {TORCH: conv_bias_residual_ref, "rocm_sd": conv_bias_residual_composed}
    if not conv_ck_reasons(*[_meta(t) for t in (x, weight, bias, residual)], pad_h, pad_w):
        for name in conv_ck_instances(_device(x)):
            candidates[f"{dispatch.CK}:{name}"] = lambda *a, _name=name: conv_bias_residual_ck(_name, *a)
    return candidates


def _no_reasons(*args) -> list[str]:
    """The composed default path runs every call (its epilogue op falls back by itself where it must)."""
    return []


def _one_kernel(reference, kernel):
    return lambda *args: {TORCH: reference, "rocm_sd": kernel}


OPS: dict[str, OpTuning] = {
    "attention": OpTuning(_attention_key, _attention_candidates, attention_ref),
    "group_norm": OpTuning(_group_norm_key, _group_norm_candidates, group_norm_ref),
    "geglu": OpTuning(_geglu_key, _one_kernel(geglu_ref, geglu_kernel), geglu_ref),
    "layer_norm": OpTuning(_layer_norm_key, _one_kernel(layer_norm_ref, layer_norm_kernel), layer_norm_ref),
    "add_layer_norm": OpTuning(_add_layer_norm_key, _one_kernel(add_layer_norm_ref, add_layer_norm_kernel),
                               add_layer_norm_ref),
    "parity_shuffle": OpTuning(_parity_shuffle_key, _one_kernel(parity_shuffle_ref, parity_shuffle_kernel),
                               parity_shuffle_ref),
    "bias_residual": OpTuning(_bias_residual_key, _one_kernel(bias_residual_ref, bias_residual_kernel),
                              bias_residual_ref),
    "linear_geglu": OpTuning(_linear_geglu_key, _linear_geglu_candidates, linear_geglu_ref),
    "conv_bias_residual": OpTuning(_conv_bias_residual_key, _conv_bias_residual_candidates,
                                   conv_bias_residual_ref),
}
SUPPORTS = {"attention": attention_supports, "group_norm": group_norm_supports, "geglu": geglu_supports,
            "layer_norm": layer_norm_supports, "add_layer_norm": add_layer_norm_supports,
            "parity_shuffle": parity_shuffle_supports, "bias_residual": bias_residual_supports,
            "linear_geglu": _no_reasons, "conv_bias_residual": _no_reasons}


def key_of(call: OpCall) -> str:
    return OPS[call.op].key(*call.args)


def candidate_reasons(op: str, args: tuple) -> list[str]:
    """Why the rocm_sd kernel cannot take these (real) arguments at all; empty when it can."""
    return SUPPORTS[op](*args)


def truth(op: str, args: tuple) -> torch.Tensor | tuple[torch.Tensor, ...]:
    return OPS[op].reference(*_double(args))
