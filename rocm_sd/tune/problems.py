"""What can be tuned per op, from the op registry (rocm_sd/ops/spec.py): each op's problem key (shared with the
dispatcher's lookup), its candidates and the float64 truth they are checked against.

Candidates are named `torch` (the op's PyTorch path at the call's dtype), `torch:<variant>` (attention: SDPA
restricted to one backend, flash / efficient / cudnn), `rocm_sd[:variant]` (the HIP kernel, called directly,
with a variant where the kernel family has several: GroupNorm's resident and split paths) or `ck:<instance>`
(a Composable Kernel instance built into _C on ROCm, ck_templates/).
"""
from __future__ import annotations

import torch

from .. import dispatch
from ..ops import REGISTRY
from .harvest import OpCall

TORCH = dispatch.TORCH
OPS = REGISTRY


def key_of(call: OpCall) -> str:
    return REGISTRY[call.op].key(*call.args)


def candidate_reasons(op: str, args: tuple) -> list[str]:
    """Why the rocm_sd kernel cannot take these (real) arguments at all; empty when it can."""
    return REGISTRY[op].supports(*args)


def _double(args: tuple) -> tuple:
    return tuple(a.double() if isinstance(a, torch.Tensor) else a for a in args)


def truth(op: str, args: tuple) -> torch.Tensor | tuple[torch.Tensor, ...]:
    return REGISTRY[op].reference(*_double(args))
