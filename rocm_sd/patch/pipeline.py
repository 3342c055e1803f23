"""optimize(pipe) / revert(pipe): apply rocm_sd to a diffusers pipeline, or to one model."""
from __future__ import annotations

import logging

from torch import nn

from .core import RECORD_ATTR, PatchRecord
from .group_norm import patch_group_norms

log = logging.getLogger("rocm_sd")

# Pipeline attributes that hold models rocm_sd knows how to patch, and the model classes it accepts.
COMPONENTS = ("unet", "vae", "controlnet")
KNOWN_MODELS = {"UNet2DConditionModel", "UNet2DModel", "AutoencoderKL", "ControlNetModel"}


def _models(target) -> dict[str, nn.Module]:
    if isinstance(target, nn.Module):
        return {type(target).__name__: target}
    found = {}
    for name in COMPONENTS:
        model = getattr(target, name, None)
        if isinstance(model, nn.Module):
            found[name] = model
    return found


def optimize(target, *, group_norm: bool = True):
    """Make a diffusers pipeline (or one of its models) use rocm_sd kernels; returns `target`.

    Flags, one per optimization, each can be turned off:
      group_norm  GroupNorm (+ the SiLU that follows it) -> rocm_sd::group_norm. Exact same math;
                  statistics in fp32, so fp16 results differ from PyTorch's by rounding only.
    Ops fall back to PyTorch per call where a kernel cannot run (CPU tensors, unsupported dtype...);
    `rocm_sd.stats()` counts which backend ran. `report(target)` says what was replaced.
    Unknown components are left untouched and listed in the report.
    """
    models = _models(target)
    if not models:
        log.warning("rocm_sd.optimize: nothing to optimize in %s", type(target).__name__)
    for name, model in models.items():
        if getattr(model, RECORD_ATTR, None) is not None:
            log.info("rocm_sd.optimize: %s is already optimized", name)
            continue
        record = PatchRecord()
        if type(model).__name__ not in KNOWN_MODELS:
            record.counts["skipped: unknown model class " + type(model).__name__] += 1
        elif group_norm:
            patch_group_norms(model, record)
        setattr(model, RECORD_ATTR, record)
    return target


def revert(target):
    """Undo optimize(): the original modules come back, so outputs equal the untouched model's bit for bit."""
    for model in _models(target).values():
        record = getattr(model, RECORD_ATTR, None)
        if record is not None:
            record.revert()
            delattr(model, RECORD_ATTR)
    return target


def report(target) -> dict[str, dict[str, int]]:
    """What optimize() replaced, per component: {'unet': {'group_norm+silu': 45, 'group_norm': 16}}."""
    out = {}
    for name, model in _models(target).items():
        record = getattr(model, RECORD_ATTR, None)
        out[name] = dict(record.counts) if record is not None else {}
    return out
