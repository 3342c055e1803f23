"""optimize(cache=...): step caching of a diffusers UNet2DConditionModel ('deepcache', 'adaptive':
modules/step_cache.py) or diffusion transformer ('fbcache', 'teacache': modules/dit_cache.py).

The model's `forward` becomes the mode's controller, which decides per call what to run. install_graphs (cuda_graph,
applied after this) graphs the controller's calls, not the controller. revert() puts the forward back: outputs are the
original's bit for bit. A mode of the other kind of model is not applied, and report() / skipped_options say why.
"""
from __future__ import annotations

import logging

from torch import nn

from ..modules import dit_cache
from ..modules.step_cache import MODES as UNET_MODES
from ..modules.step_cache import UNetStepCache, unet_problem
from .core import PatchRecord

log = logging.getLogger("rocm_sd")

ADAPTIVE_THRESHOLD = 0.15  # the default threshold of cache='adaptive' (docs/step_cache.md has what it measured)


def threshold(mode: str, model_class: str, given: float | None) -> float | None:
    """cache_threshold as applied: the one given, else the mode's default for the model class (None for a
    transformer mode on another class)."""
    if given is not None:
        return given
    if mode in UNET_MODES:
        return ADAPTIVE_THRESHOLD
    return dit_cache.THRESHOLDS.get((mode, model_class))


def other_kind(mode: str, transformer: bool) -> str | None:
    """Why `mode` does not apply to a diffusion transformer (transformer=True) or a UNet, or None where it does."""
    if mode in dit_cache.MODES and not transformer:
        return (f"cache={mode!r} is for the diffusion transformers (SD3 / SD3.5, Flux); UNets take "
                f"{' or '.join(repr(m) for m in UNET_MODES)}")
    if mode in UNET_MODES and transformer:
        return (f"cache={mode!r} is for UNets; the diffusion transformers take "
                f"{' or '.join(repr(m) for m in dit_cache.MODES)}")
    return None


def _problem(mode: str, model: nn.Module, branch: int) -> str | None:
    transformer = type(model).__name__ in dit_cache.BLOCK_LISTS
    return other_kind(mode, transformer) or (dit_cache.dit_problem(model) if transformer else unet_problem(model, branch))


def cache_steps(model: nn.Module, record: PatchRecord, options: dict) -> None:
    mode = options["cache"]
    if mode is None:
        return
    problem = _problem(mode, model, options["cache_branch"])
    if problem is not None:
        record.skip_option("cache", f"step cache not applied: {problem}")
        log.warning("rocm_sd.optimize: cache=%r not applied to %s: %s", mode, type(model).__name__, problem)
        return
    limit = threshold(mode, type(model).__name__, options["cache_threshold"])
    if mode in dit_cache.MODES:
        controller = dit_cache.DiTStepCache(model, mode, limit, record.counts)
        setting = f"threshold {limit:g}"
    else:
        controller = UNetStepCache(model, mode, options["cache_interval"], limit,
                                   record.counts, options["cache_branch"])
        setting = f"interval {options['cache_interval']}" if mode == "deepcache" else f"threshold {limit:g}"
        setting += f", branch {options['cache_branch']}"
    record.set_attr(model, "forward", controller)
    record.on_revert(controller.forget)  # the cached features go with revert(), not with a later gc
    record.on_invalidate(controller.forget)  # features of weights changed since (a LoRA scale) are stale too
    record.counts[f"step cache: {mode} ({setting})"] += 1
