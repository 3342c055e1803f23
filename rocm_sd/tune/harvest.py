"""The op calls a model really makes: run the pipeline once under a dispatch mode that records every
rocm_sd op with its argument shapes, strides and dtypes (no values), each distinct call once.

A TorchDispatchMode sees custom ops as the dispatcher calls them, after optimize() has put them in the
model, so the shapes are the model's own, in its layouts, whatever the pipeline does around them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAMESPACE = "rocm_sd"


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def make(self, device, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random values (never zeros: docs/design.md, convention 7) in exactly this shape and stride."""
        size = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) if all(self.shape) else 0
        base = torch.randn(size, device=device, dtype=torch.float32, generator=generator).to(self.dtype)
        return base.as_strided(self.shape, self.stride)


@dataclass(frozen=True)
class OpCall:
    op: str            # rocm_sd op name: group_norm, geglu, ...
    args: tuple        # TensorSpec for tensors, the value otherwise, in the op schema's order

    def make_args(self, device, generator: torch.Generator | None = None) -> tuple:
        return tuple(a.make(device, generator) if isinstance(a, TensorSpec) else a for a in self.args)


def _spec(value):
    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(value.shape), tuple(value.stride()), value.dtype)
    return value


class RecordingMode(TorchDispatchMode):
    """Records each distinct rocm_sd op call (by specs) in first-seen order, with how often it ran."""

    def __init__(self):
        super().__init__()
        self.calls: dict[OpCall, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == NAMESPACE:
            names = [a.name for a in func._schema.arguments]
            bound = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
            call = OpCall(func._schema.name.split("::")[-1], tuple(_spec(a) for a in bound))
            self.calls[call] = self.calls.get(call, 0) + 1
        return func(*args, **kwargs)


def harvest(call_pipeline) -> dict[OpCall, int]:
    """Every distinct rocm_sd op call that `call_pipeline()` makes, and how often. Graphed calls run
    eagerly while a dispatch mode is active (graphs.py), so the recording sees every op."""
    mode = RecordingMode()
    with torch.inference_mode(), mode:
        call_pipeline()
    return mode.calls
