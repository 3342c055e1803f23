"""Harvesting without a GPU: on a CPU, `python -m rocm_sd.tune --list` / --dry-run runs the pipeline on the meta
device (shapes, strides and dtypes; no memory, no values), in the GPU's dtype, once, as tuning on the GPU would.

A meta run differs from a GPU run in two places, and both are mended here:
- the scheduler reads the values of its sigmas (which step a timestep is), which meta tensors do not have:
  ShapeOnlyScheduler takes its place, with its configuration and number of steps, and leaves the latents as they are
  (only shapes reach the denoiser, and only shapes are recorded);
- meta's convolution answers a contiguous output whatever its arguments (it cannot know the backend), where cuDNN
  and MIOpen answer channels_last when the input or the weight is channels_last: gpu_conv_layouts gives the
  convolutions the layout the GPU's would have, so the ops after them see the GPU's layouts.
"""
from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format
from torch.utils._python_dispatch import TorchDispatchMode


class ShapeOnlyScheduler:
    """A scheduler's place in a meta run: the real one's `config` (which the pipelines read: shift, dynamic
    shifting), its steps as meta timesteps, and steps that return the latents unchanged."""
    order = 1
    init_noise_sigma = 1.0

    def __init__(self, scheduler):
        self.config = scheduler.config
        self.timesteps = None

    def set_timesteps(self, num_inference_steps=None, device=None, timesteps=None, sigmas=None, **kwargs) -> None:
        steps = num_inference_steps or len(timesteps if timesteps is not None else sigmas)
        self.timesteps = torch.empty(steps, device=device)

    def set_begin_index(self, begin_index: int = 0) -> None:
        pass

    def scale_model_input(self, sample, timestep=None):
        return sample

    def step(self, model_output, timestep, sample, *args, return_dict: bool = True, **kwargs):
        return (sample,)


class gpu_conv_layouts(TorchDispatchMode):  # noqa: N801  (used as a context manager, like torch's modes)
    """Convolutions on meta tensors answer channels_last where the input or the weight is channels_last, as cuDNN
    and MIOpen do (cudnn_conv_suggest_memory_format, miopen_conv_use_channels_last)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in CONVOLUTIONS and out.dim() == 4 and out.device.type == "meta" and any(
                suggest_memory_format(t) is torch.channels_last for t in args[:2]):
            out = out.contiguous(memory_format=torch.channels_last)
        return out


aten = torch.ops.aten
CONVOLUTIONS = (aten.conv2d, aten.convolution, aten._convolution)  # a mode sees conv2d itself (inference mode too)
