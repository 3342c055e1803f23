"""Swaps nn.LayerNorm over one dimension (the transformer blocks' norm1/2/3) for LayerNormFused."""
from __future__ import annotations

from torch import nn

from ..modules.layer_norm import LayerNormFused
from .core import PatchRecord


def patch_layer_norms(model: nn.Module, record: PatchRecord) -> None:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm and len(child.normalized_shape) == 1:
                record.replace_child(parent, name, LayerNormFused.from_layer_norm(child))
                record.counts["layer_norm"] += 1
