"""Swaps diffusers' GEGLU (the transformer feed-forward's gated activation) for GEGLUFused."""
from __future__ import annotations

from torch import nn

from ..modules.geglu import GEGLUFused
from .core import PatchRecord


def _is_diffusers_geglu(module: nn.Module) -> bool:
    # Exactly diffusers' class, with exact gelu: subclasses may compute something else.
    return (type(module).__name__ == "GEGLU" and type(module).__module__ == "diffusers.models.activations"
            and isinstance(getattr(module, "proj", None), nn.Linear))


def patch_geglus(model: nn.Module, record: PatchRecord) -> None:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_diffusers_geglu(child):
                record.replace_child(parent, name, GEGLUFused.from_geglu(child))
                record.counts["geglu"] += 1
