"""The ComfyUI node's precision option ('fp8' / 'int8') on ComfyUI's diffusion transformers, SD3 / SD3.5 (MMDiT) and
Flux: their blocks' linear layers as 8-bit GEMMs of the weights ComfyUI has at call time (modules/quantized_linear.
QuantizedHostCopy, as the UNet's: patch/comfy.quantized_swaps).

Which layers: the ones optimize(precision=...) makes 8-bit in diffusers' blocks (patch/precision_dit.py's
selected_name and fits, one rule). Each of ComfyUI's layers is named by the diffusers layers it computes
(DIFFUSERS_NAMES: ComfyUI's fused qkv is diffusers' to_qkv / to_added_qkv, Flux's single block's linear1 is to_qkv and
proj_mlp side by side), and it is taken where every one of those is selected and its own sizes fit the GEMM. So the
AdaLN modulations (adaLN_modulation, img_mod / txt_mod / modulation: diffusers' norm*.linear) stay ComfyUI's, and so
does everything outside the blocks (embedders, final layer), as in diffusers. A layer of a block that has no diffusers
name here (a newer ComfyUI's part) is left as it is.

Where the quantizer cannot read the weight ComfyUI computes with, the layer stays ComfyUI's: weights in ComfyUI's own
quantized layouts (a tensor subclass: scaled fp8 checkpoints, comfy-kitchen's formats; the node says how many), and,
per call, weights ComfyUI scales, casts from another device or patches in its forward (patch/comfy.
_host_patches_per_call). A weight it stores in fp8 and only casts (weight_dtype fp8_e4m3fn) is read as it is: the
cast is exact.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from ..modules.comfy_dit import FLUX, MMDIT
from ..modules.host_copies import quantized_linear_copy
from ..modules.quantized_linear import quantizable_weight
from . import ldm_swaps
from .precision_dit import fits, selected_name

_JOINT_STREAM = {"attn.qkv": "attn.to_qkv", "attn.proj": "attn.to_out.0", "mlp.fc1": "ff.net.0.proj",
                 "mlp.fc2": "ff.net.2", "adaLN_modulation.1": "norm1.linear"}
_CONTEXT_STREAM = {"attn.qkv": "attn.to_added_qkv", "attn.proj": "attn.to_add_out", "mlp.fc1": "ff_context.net.0.proj",
                   "mlp.fc2": "ff_context.net.2", "adaLN_modulation.1": "norm1_context.linear"}
_DOUBLE_STREAMS = {"img": ("attn.to_qkv", "attn.to_out.0", "ff.net.0.proj", "ff.net.2", "norm1.linear"),
                   "txt": ("attn.to_added_qkv", "attn.to_add_out", "ff_context.net.0.proj", "ff_context.net.2",
                           "norm1_context.linear")}

# (module, class) of ComfyUI's block -> {its layer's name inside the block: the names of the layers of diffusers'
# block (JointTransformerBlock, FluxTransformerBlock, FluxSingleTransformerBlock) that compute the same thing}
DIFFUSERS_NAMES: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    (MMDIT, "JointBlock"): {
        **{f"x_block.{name}": (theirs,) for name, theirs in _JOINT_STREAM.items()},
        "x_block.attn2.qkv": ("attn2.to_qkv",), "x_block.attn2.proj": ("attn2.to_out.0",),  # SD3.5 Medium
        **{f"context_block.{name}": (theirs,) for name, theirs in _CONTEXT_STREAM.items()}},
    (FLUX, "DoubleStreamBlock"): {
        f"{stream}_{part}": (theirs,) for stream, names in _DOUBLE_STREAMS.items()
        for part, theirs in zip(("attn.qkv", "attn.proj", "mlp.0", "mlp.2", "mod.lin"), names)},
    (FLUX, "SingleStreamBlock"): {"linear1": ("attn.to_qkv", "proj_mlp"), "linear2": ("proj_out",),
                                  "modulation.lin": ("norm.linear",)},
}


def _block_key(module) -> tuple[str, str]:
    return type(module).__module__, type(module).__name__


def _features(module) -> tuple[int, int] | None:
    """(in, out) features of a Linear, or of a host's own linear module of another class (ComfyUI's mixed-precision
    Linear is a plain Module), else None."""
    sizes = getattr(module, "in_features", None), getattr(module, "out_features", None)
    return sizes if isinstance(module, nn.Module) and all(isinstance(n, int) for n in sizes) else None


def _hosts_own(layer) -> bool:
    """Whether ComfyUI computes this layer in a way the 8-bit copy cannot read: a module that is no Linear (its
    mixed-precision ops), a weight in a layout of its own (a tensor subclass: QuantizedTensor), or an fp8 weight with
    a scale beside it (older ComfyUI's scaled fp8 ops, which multiply it in per call)."""
    return (not isinstance(layer, nn.Linear) or not quantizable_weight(layer.weight)
            or getattr(layer, "scale_weight", None) is not None)


def dit_selection(root, multiple: int, resolve: ldm_swaps.Resolve | None = None) -> dict[str, tuple[str, ...]]:
    """{dotted path under root of each of ComfyUI's block linear layers that becomes 8-bit: the diffusers names it
    stands for}, by precision_dit's rule (the module doc); the model's own modules, as `resolve` says
    (ldm_swaps.original_modules), whatever another clone has installed."""
    modules = ldm_swaps.original_modules(root, resolve)
    chosen = {}
    for path, block in modules.items():
        names = DIFFUSERS_NAMES.get(_block_key(block))
        for name, theirs in (names or {}).items():
            layer_path = f"{path}.{name}" if path else name
            features = _features(modules.get(layer_path))
            if features and all(selected_name(n) for n in theirs) and fits(*features, multiple):
                chosen[layer_path] = theirs
    return chosen


def quantized_dit_swaps(root, precision: str, format: str, multiple: int, host_path: Callable[[nn.Module], bool],
                        resolve: ldm_swaps.Resolve | None = None,
                        measured: bool = True) -> tuple[dict[str, nn.Module], list[str]]:
    """({dotted path: 8-bit copy of `format` (modules/host_copies.quantized_linear_copy)} for dit_selection's layers,
    [what stays ComfyUI's and why, for the node's report; `precision` the option's value]). `host_path(layer)`: ComfyUI
    computes the layer's weight per call (its own forward then runs). With `measured` (precision_layers="measured")
    each copy runs ComfyUI's forward from its first call on where the tuning database measured fp16 faster for its
    shape; its input is its own (ComfyUI's qkv and linear1 are one layer each), quantized by the layer itself."""
    modules = ldm_swaps.original_modules(root, resolve)
    swaps, hosts_own = {}, 0
    for path in dit_selection(root, multiple, resolve):
        if _hosts_own(modules[path]):
            hosts_own += 1
            continue
        swaps[path] = quantized_linear_copy(modules[path], format, host_path)
        if measured:
            swaps[path].rocm_sd_offer_fp16(1, [])
    notes = []
    if hosts_own:
        notes.append(f"precision={precision}: {hosts_own} linear layer{'s' if hosts_own > 1 else ''} of the "
                     "transformer blocks stay ComfyUI's, computed in its own quantized format (a scaled fp8 "
                     "checkpoint, comfy-kitchen's or its mixed-precision layouts), which only its forward reads")
    elif not swaps:
        notes.append(f"precision={precision} not applied: no linear layer of the model's SD3 / Flux blocks that "
                     f"rocm_sd knows has features a multiple of {multiple}")
    return swaps, notes
