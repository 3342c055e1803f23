"""Kernel-backed copies of a host app's own modules (norms, upsamplers, 8-bit linears), for hosts that patch by object replacement
(ComfyUI's object patches, A1111's module hijacks) rather than by rocm_sd's in-place optimize().

The copy keeps the module's class (a subclass is made on the fly) and is a second face of the module itself: it
shares the module's attribute dictionary, so its parameter slots, children and every piece of the host's bookkeeping
(ComfyUI's loaded-and-patched flags and low-VRAM casting, the webui's LoRA backups, a padding mode set later) are the
module's, read at call time, never a snapshot taken when the copy was made. A host that swaps a weight through
either face (ComfyUI sets a LoRA'd Parameter on whatever module its path holds, and restores the backup the same
way) swaps it for both. The copy's own settings live in slots, outside that dictionary. Whenever the host would take
its own path for a call (weights cast or streamed per call, as ComfyUI does in low-VRAM mode), the copy runs the
original forward and applies the activation after it. `unpatched()` gives the module a copy was made of.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.group_norm import group_norm
from ..ops.layer_norm import layer_norm
from ..ops.quantize import FORMATS
from ..ops.quantized_outputs import layer_norm_quantize_rows
from .pointwise import is_pointwise
from .quantized_linear import QuantizedHostCopy, remember_rows

_SUBCLASSES: dict[tuple[type, str], type] = {}
# Each kind's own settings (slots: per copy, outside the dictionary it shares with its module).
_SLOTS = {"group_norm": ("rocm_sd_act", "rocm_sd_host_path"),
          "upsample": ("rocm_sd_host_path", "rocm_sd_folded"),
          "conv_channels_last": ("rocm_sd_host_path",),
          "layer_norm": ("rocm_sd_host_path", "rocm_sd_quantized_output"),
          "quantized_linear": ("rocm_sd_format", "rocm_sd_conv", "rocm_sd_host_path", "rocm_sd_fp16",
                               "rocm_sd_fp16_offer")}


def _never(module: nn.Module) -> bool:
    return False


class _OwnSettings:
    """Keeps a copy's slots through copy.deepcopy and pickle, which nn.Module does by its __dict__ alone."""
    __slots__ = ()
    _KEY = "_rocm_sd_slots"

    def __getstate__(self):
        names = [n for cls in type(self).__mro__ for n in cls.__dict__.get("__slots__", ())]
        state = super().__getstate__()
        state[self._KEY] = {n: object.__getattribute__(self, n) for n in names if hasattr(self, n)}
        return state

    def __setstate__(self, state):
        slots = state.pop(self._KEY, {})
        super().__setstate__(state)
        for name, value in slots.items():
            object.__setattr__(self, name, value)


def _subclass(base: type, kind: str) -> type:
    key = (base, kind)
    if key not in _SUBCLASSES:
        if kind == "group_norm":
            def forward(self, x):
                silu = self.rocm_sd_act == "silu"
                if self.rocm_sd_host_path(self) or x.dim() < 2:
                    y = base.forward(self, x)
                    return F.silu(y) if silu else y
                return group_norm.call(x, self.num_groups, self.weight, self.bias, self.eps, silu, None)
        elif kind == "upsample":
            from .upsample import conv_foldable, folded_upsample_conv

            def forward(self, x):
                # conv_foldable at call time: a padding mode set after the copy was made (the webui's tiling sets
                # "circular") is not the zero padding the folded kernels assume.
                if (self.rocm_sd_host_path(self.conv) or not conv_foldable(self.conv) or x.dim() != 4
                        or x.dtype != self.conv.weight.dtype or torch.compiler.is_compiling()):
                    return base.forward(self, x)
                return folded_upsample_conv(x, self.conv, self.rocm_sd_folded)
        elif kind == "conv_channels_last":
            def forward(self, x):
                if (self.rocm_sd_host_path(self) or x.dim() != 4 or x.dtype != self.weight.dtype
                        or x.device != self.weight.device):
                    return base.forward(self, x)
                # A channels_last weight makes the convolution's output channels_last (PyTorch follows the input
                # or the weight), so the activations stay NHWC from layer to layer and cuDNN / MIOpen run their
                # NHWC kernels without transposing every input, output and filter. The weight is converted per
                # call (one copy of the filter, which the vendor did anyway on NCHW tensors): the host's own
                # Parameter stays as it is for its weight patching (LoRA) and memory accounting.
                return self._conv_forward(x, self.weight.contiguous(memory_format=torch.channels_last), self.bias)
        elif kind == "quantized_linear":  # the forward is QuantizedHostCopy's
            _SUBCLASSES[key] = type(f"Rocm{base.__name__}", (_OwnSettings, QuantizedHostCopy, base),
                                    {"__module__": __name__, "__slots__": ("rocm_sd_source",) + _SLOTS[kind]})
            return _SUBCLASSES[key]
        else:
            def forward(self, x):
                if self.rocm_sd_host_path(self) or len(self.normalized_shape) != 1:
                    return base.forward(self, x)
                # The ldm repository's SpatialTransformer gives its norms a (b, h*w, c) view of an NCHW tensor (its
                # rearrange has no .contiguous()); torch's layer_norm copies such an input as well.
                x = x.contiguous()
                fmt = self.rocm_sd_quantized_output
                if fmt is None:
                    return layer_norm.call(x, self.weight, self.bias, self.eps)
                # Every consumer of this output is an 8-bit GEMM of `fmt` (ldm_swaps.quantized_input_groups): the
                # kernel writes the output's per-row quantization too, which they take instead of quantizing it.
                y, q, scale = layer_norm_quantize_rows.call(x, self.weight, self.bias, self.eps, fmt)
                remember_rows(y, fmt, q, scale, trusted=True)
                return y
        _SUBCLASSES[key] = type(f"Rocm{base.__name__}", (_OwnSettings, base), {
            "forward": forward, "__module__": __name__, "__slots__": ("rocm_sd_source",) + _SLOTS[kind]})
    return _SUBCLASSES[key]


def face_class(base: type, kind: str, forward: Callable, slots: tuple[str, ...] = ("rocm_sd_host_path",)) -> type:
    """A subclass of the host's class `base` with its own `forward` and `slots` (the copy's own settings), made once per
    (base, kind), for copies made with host_face elsewhere (modules/comfy_dit.py's transformer blocks)."""
    key = (base, kind)
    if key not in _SUBCLASSES:
        _SUBCLASSES[key] = type(f"Rocm{base.__name__}", (_OwnSettings, base), {
            "forward": forward, "__module__": __name__, "__slots__": ("rocm_sd_source",) + tuple(slots)})
    return _SUBCLASSES[key]


def upsample_copy(module: nn.Module, host_path: Callable[[nn.Module], bool] = _never) -> nn.Module:
    """A host's nearest-2x-then-conv upsampler (`conv`, a 3x3 nn.Conv2d, after interpolation) running the folded
    2x2 convolution of modules/upsample.py, unless host_path(conv)."""
    new = host_face(module, _subclass(type(unpatched(module)), "upsample"))
    new.rocm_sd_host_path, new.rocm_sd_folded = host_path, {}
    return new


def conv_channels_last_copy(module: nn.Conv2d, host_path: Callable[[nn.Module], bool] = _never) -> nn.Module:
    """`module` (a 2-D convolution) run on a channels_last view of its weight, unless host_path(copy): its
    outputs, and so the activations after it, are channels_last."""
    if not isinstance(module, nn.Conv2d):
        raise TypeError(f"expected an nn.Conv2d, got {type(module).__name__}")
    new = host_face(module, _subclass(type(unpatched(module)), "conv_channels_last"))
    new.rocm_sd_host_path = host_path
    return new


def copy_as(module: nn.Module, cls: type) -> nn.Module:
    """A shallow copy of `module` as an instance of `cls` (a subclass of its class), sharing its Parameters."""
    new = cls.__new__(cls)
    new.__dict__ = module.__dict__.copy()
    new._parameters = dict(module._parameters)  # the same Parameter objects, in a dict of its own
    new._buffers = dict(module._buffers)
    new._modules = dict(module._modules)
    return new


def host_face(module: nn.Module, cls: type) -> nn.Module:
    """`module` as an instance of `cls` (a subclass of its class with slots for its own settings) sharing the module's
    attribute dictionary: its parameters, children and host bookkeeping are the module's, whenever they are read.
    `module` is unpatched() first: a copy is never made of a copy."""
    module = unpatched(module)
    new = cls.__new__(cls)
    object.__setattr__(new, "__dict__", module.__dict__)
    object.__setattr__(new, "rocm_sd_source", module)  # a slot: not registered as a child module
    return new


def unpatched(module):
    """The host's own module behind a copy made here (or behind fused_away's Identity); anything else as it is."""
    while True:
        try:
            module = object.__getattribute__(module, "rocm_sd_source")
        except AttributeError:
            return module


class FusedAway(_OwnSettings, nn.Identity):
    """An activation computed by the norm copy before it (group_norm_copy's act): nothing left to do here."""
    __slots__ = ("rocm_sd_source",)


def fused_away(module: nn.Module) -> nn.Module:
    """An Identity standing in for `module`, an activation fused into the copy before it (unpatched() gives it back)."""
    new = FusedAway()
    object.__setattr__(new, "rocm_sd_source", unpatched(module))
    return new


def group_norm_copy(module: nn.GroupNorm, act: str | None = None,
                    host_path: Callable[[nn.Module], bool] = _never) -> nn.Module:
    """`module` followed by `act` (None or "silu") as one rocm_sd::group_norm call, unless host_path(copy)."""
    if not isinstance(module, nn.GroupNorm):
        raise TypeError(f"expected an nn.GroupNorm, got {type(module).__name__}")
    new = host_face(module, _subclass(type(unpatched(module)), "group_norm"))
    new.rocm_sd_act, new.rocm_sd_host_path = act, host_path
    return new


def layer_norm_copy(module: nn.LayerNorm, host_path: Callable[[nn.Module], bool] = _never) -> nn.Module:
    """`module` as rocm_sd::layer_norm over its last dimension, unless host_path(copy). Its attribute
    `rocm_sd_quantized_output` (None) may name the 8-bit format its every consumer multiplies in."""
    if not isinstance(module, nn.LayerNorm):
        raise TypeError(f"expected an nn.LayerNorm, got {type(module).__name__}")
    new = host_face(module, _subclass(type(unpatched(module)), "layer_norm"))
    new.rocm_sd_host_path, new.rocm_sd_quantized_output = host_path, None
    return new


def quantized_linear_copy(module: nn.Module, format: str,
                          host_path: Callable[[nn.Module], bool] = _never) -> nn.Module:
    """`module` (a Linear, or a 1x1 Conv2d) as an 8-bit GEMM of `format` (ops/quantize.FORMATS) of its current
    weight (modules/quantized_linear.QuantizedHostCopy), unless host_path(copy)."""
    if format not in FORMATS:
        raise ValueError(f"quantized_linear_copy: format {format!r} is not one of {', '.join(FORMATS)}")
    if not (isinstance(module, nn.Linear) or is_pointwise(module, any_class=True)):
        raise TypeError(f"expected an nn.Linear or a 1x1 nn.Conv2d, got {type(module).__name__}")
    new = host_face(module, _subclass(type(unpatched(module)), "quantized_linear"))
    new.rocm_sd_format, new.rocm_sd_conv, new.rocm_sd_host_path = format, isinstance(module, nn.Conv2d), host_path
    new.rocm_sd_fp16, new.rocm_sd_fp16_offer = False, None
    return new
