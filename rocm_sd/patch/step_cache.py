"""optimize(cache=...): step caching of a diffusers UNet2DConditionModel (modules/step_cache.py says what it does).

The UNet's `forward` becomes a UNetStepCache, which decides per call whether to run the whole UNet or only its
outermost branch with a cached deep feature. install_graphs (cuda_graph, applied after this) graphs the
controller's two calls, not the controller. revert() puts the forward back: outputs are the original's bit for bit.
"""
from __future__ import annotations

import logging

from torch import nn

from ..modules.step_cache import UNetStepCache, unet_problem
from .core import PatchRecord

log = logging.getLogger("rocm_sd")


def cache_steps(model: nn.Module, record: PatchRecord, options: dict) -> None:
    mode = options["cache"]
    if mode is None:
        return
    problem = unet_problem(model, options["cache_branch"])
    if problem is not None:
        record.skip_option("cache", f"step cache not applied: {problem}")
        log.warning("rocm_sd.optimize: cache=%r not applied to %s: %s", mode, type(model).__name__, problem)
        return
    controller = UNetStepCache(model, mode, options["cache_interval"], options["cache_threshold"], record.counts,
                               options["cache_branch"])
    record.set_attr(model, "forward", controller)
    record.on_revert(controller.forget)  # the cached features go with revert(), not with a later gc
    setting = f"interval {options['cache_interval']}" if mode == "deepcache" else \
        f"threshold {options['cache_threshold']}"
    setting += f", branch {options['cache_branch']}"
    record.counts[f"step cache: {mode} ({setting})"] += 1
