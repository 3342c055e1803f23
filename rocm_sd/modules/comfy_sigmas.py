"""Where a ComfyUI model evaluation stands in its sampling run, for the transformers' step cache
(modules/comfy_dit_cache.py).

ComfyUI's sampler puts the run's whole schedule into transformer_options["sample_sigmas"] (comfy/samplers.py,
CFGGuider.inner_sample; outer_sample moved it to the device first) and evaluates the model at sigma = sample_sigmas[i]
for i < len - 1. Knowing the schedule tells the cache two things the sigmas of single calls cannot: that a run starts
(its first sigma, or a new schedule tensor: an interrupted run followed by an img2img one that starts lower would
otherwise look like its next step), and which evaluation is the run's last (TeaCache runs it in full).
"""
from __future__ import annotations

import weakref

import torch

# How near a sigma must be to a schedule entry to be that entry: the sampler hands over sample_sigmas[i] * 1.0 in the
# schedule's dtype, so equal in practice; a tolerance keeps a float64 schedule with float32 calls working.
_RELATIVE_TOLERANCE = 1e-6


class SamplingRuns:
    """`locate(sigma, schedule)` per evaluation: the evaluation's (index, number of sigmas) in the schedule, or None
    where there is no schedule or sigma is not one of its entries (a second-order sampler's midpoints). `runs` counts
    the runs seen: it goes up at a new schedule tensor and at the schedule's first sigma after an evaluation at
    another one (split CFG's two calls at the first sigma are one run). The schedule's values are read to the host
    once per schedule tensor (one host sync per run)."""

    def __init__(self):
        self._schedule = None    # weak reference to the schedule tensor whose values `_values` are
        self._values: list[float] = []
        self._last: int | None = None   # the previous evaluation's index
        self.runs = 0

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def reset(self) -> None:
        self._schedule, self._values, self._last = None, [], None

    def locate(self, sigma: float, schedule) -> tuple[int, int] | None:
        if not isinstance(schedule, torch.Tensor) or schedule.dim() != 1 or schedule.numel() < 2:
            self._last = None
            return None
        new = self._schedule is None or self._schedule() is not schedule
        if new:  # (ComfyUI runs nodes under inference_mode: an inference tensor has no version to compare)
            self._values = [float(v) for v in schedule.tolist()]
            self._schedule = weakref.ref(schedule)
            self.runs += 1
        index = next((i for i, v in enumerate(self._values[:-1])
                      if abs(v - sigma) <= _RELATIVE_TOLERANCE * max(1.0, abs(v))), None)
        if index == 0 and not new and self._last != 0:
            self.runs += 1   # the same schedule tensor sampled again
        self._last = index
        return None if index is None else (index, len(self._values))
