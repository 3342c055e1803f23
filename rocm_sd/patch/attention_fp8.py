"""optimize(attention_precision="fp8"): the UNet's attention (its RocmAttnProcessors) through rocm_sd::attention_fp8,
which runs the FP8 kernel at each shape where the tuning database measured it faster than the fp16 attention, and
the fp16 attention elsewhere (ops/attention_fp8.py). Needs the `attention` flag (the processors it installs)."""
from __future__ import annotations

import logging

import torch
from torch import nn

from .. import platform
from ..modules.attention import RocmAttnProcessor
from ..ops.quantize import fp8_format
from .core import PatchRecord

log = logging.getLogger("rocm_sd")


def fp8_of(device: torch.device) -> tuple[str | None, str | None]:
    """(the FP8 format of `device`'s matrix units, None), or (None, why it has none)."""
    if device.type != "cuda":
        return None, f"the model is on {device.type}; FP8 attention needs a GPU"
    return fp8_format(platform.device_arch(device))


def attention_in_fp8(model: nn.Module, record: PatchRecord, options: dict) -> None:
    if options["attention_precision"] == "fp16":
        return
    fmt, why = fp8_of(next((p.device for p in model.parameters()), torch.device("cpu")))
    processors = [m.processor for m in model.modules() if isinstance(getattr(m, "processor", None), RocmAttnProcessor)]
    if fmt is not None and not processors:
        why = "no attention runs through rocm_sd (the `attention` flag is off)"
    if why:
        record.skip_option("attention_precision", f"attention_precision=fp8 not applied: {why}")
        log.warning("rocm_sd.optimize: attention_precision=fp8 not applied to %s, its attention stays fp16: %s",
                    type(model).__name__, why)
        return
    for processor in processors:
        processor.fp8_format = fmt
        record.on_revert(setattr, processor, "fp8_format", None)
        record.counts[f"attention -> {fmt} where measured faster"] += 1
