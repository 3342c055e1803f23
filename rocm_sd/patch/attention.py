"""Sets RocmAttnProcessor on diffusers' Attention modules that run AttnProcessor2_0 or its fused-QKV
variant; other processors (xformers, IP-Adapter, custom ones) are left as they are and counted."""
from __future__ import annotations

from torch import nn

from ..modules.attention import RocmAttnProcessor
from .core import PatchRecord

REPLACED = {"AttnProcessor2_0", "FusedAttnProcessor2_0"}


def patch_attention(model: nn.Module, record: PatchRecord) -> None:
    from diffusers.models.attention_processor import Attention

    for module in model.modules():
        if not isinstance(module, Attention):
            continue
        old = module.processor
        if type(old).__name__ not in REPLACED:
            record.counts[f"attention kept: {type(old).__name__}"] += 1
            continue
        module.set_processor(RocmAttnProcessor(old))
        record.on_revert(module.set_processor, old)
        record.counts["attention processor"] += 1
