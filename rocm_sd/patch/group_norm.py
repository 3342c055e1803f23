"""Swaps GroupNorm (+ SiLU) in diffusers models for rocm_sd::group_norm.

Fusions, each only where the module's forward is known to apply the two in sequence:
  - ResnetBlock2D (time_embedding_norm "default", or the VAE decoder's "group" without a time embedding;
    SiLU nonlinearity): norm1 and norm2 become
    GroupNorm+SiLU and `nonlinearity` becomes Identity; the one other use of `nonlinearity`, on the
    time embedding, moves into a forward pre-hook of the block on its `temb` argument, so the block computes
    the same.
  - conv_norm_out followed by conv_act (UNet2DConditionModel, UNet2DModel, the VAE's Encoder and
    Decoder): conv_norm_out becomes GroupNorm+SiLU and conv_act becomes Identity.
Every other nn.GroupNorm becomes a plain rocm_sd GroupNorm.
"""
from __future__ import annotations

from torch import nn

from ..modules.group_norm import GroupNormAct
from .core import PatchRecord
from .resnet import plain_time_embedding, silu_temb

# Classes whose forward runs `conv_act(conv_norm_out(x))` and uses conv_act nowhere else.
NORM_OUT_THEN_ACT = {"UNet2DConditionModel", "UNet2DModel", "Encoder", "Decoder"}


def _is_plain_group_norm(m) -> bool:
    return type(m) is nn.GroupNorm


def _fuse_resnet(block: nn.Module, record: PatchRecord) -> bool:
    if not (plain_time_embedding(block) and isinstance(block.nonlinearity, nn.SiLU)
            and _is_plain_group_norm(block.norm1) and _is_plain_group_norm(block.norm2)):
        return False
    record.replace_child(block, "norm1", GroupNormAct.from_group_norm(block.norm1, act="silu"))
    record.replace_child(block, "norm2", GroupNormAct.from_group_norm(block.norm2, act="silu"))
    record.replace_child(block, "nonlinearity", nn.Identity())
    if block.time_emb_proj is not None and not block.skip_time_act:
        record.add_hook(block.register_forward_pre_hook(silu_temb, with_kwargs=True))
    record.counts["group_norm+silu"] += 2
    return True


def patch_group_norms(model: nn.Module, record: PatchRecord) -> None:
    from diffusers.models.resnet import ResnetBlock2D

    for module in list(model.modules()):
        if isinstance(module, ResnetBlock2D):
            _fuse_resnet(module, record)
        elif (type(module).__name__ in NORM_OUT_THEN_ACT and _is_plain_group_norm(getattr(module, "conv_norm_out", None))
              and isinstance(getattr(module, "conv_act", None), nn.SiLU)):
            record.replace_child(module, "conv_norm_out", GroupNormAct.from_group_norm(module.conv_norm_out, "silu"))
            record.replace_child(module, "conv_act", nn.Identity())
            record.counts["group_norm+silu"] += 1
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_plain_group_norm(child):
                record.replace_child(parent, name, GroupNormAct.from_group_norm(child))
                record.counts["group_norm"] += 1
