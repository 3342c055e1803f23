"""optimize(cache=...): DeepCache-style step caching of the UNet."""
from __future__ import annotations

from torch import nn

from .core import PatchRecord


def cache_steps(model: nn.Module, record: PatchRecord, options: dict) -> None:
    if options["cache"] is None:
        return
    raise NotImplementedError("cache=" + options["cache"])  # in progress on branch i25
