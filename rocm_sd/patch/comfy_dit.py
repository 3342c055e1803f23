"""Which modules of ComfyUI's diffusion transformers are which: SD3 / SD3.5 (comfy/ldm/modules/diffusionmodules/
mmdit.py, MMDiT) and Flux (comfy/ldm/flux/model.py), and Forge's Flux (backend/nn/flux.py,
IntegratedFluxTransformer2DModel, which the A1111 extension's Forge path patches through the same ModelPatcher
interface). Their blocks become modules/comfy_dit.py's copies; blocks of another structure, or another class in a
block's place (another node's or extension's object patch), stay the host's, and the caller says which and why.

Flux's rope is applied by rocm_sd::rms_norm only where the rope tensor comes from Flux's own embedder
(modules/comfy_dit._rotary says when else), so only the Flux model classes themselves are taken, not others that
reuse their blocks with rope tensors of their own (nor Forge's Chroma, whose blocks are its own classes and take
per-block modulations from its approximator: it stays on the UNet path's LayerNorm copies).
"""
from __future__ import annotations

import sys
from collections import Counter
from typing import Callable

from torch import nn

from ..modules.comfy_dit import block_kind, block_problem, dit_block_copy
from . import ldm_swaps

MODELS = {("comfy.ldm.modules.diffusionmodules.mmdit", "MMDiT"): "joint_blocks",
          ("comfy.ldm.modules.diffusionmodules.mmdit", "OpenAISignatureMMDITWrapper"): "joint_blocks",
          ("comfy.ldm.flux.model", "Flux"): "double_blocks",
          ("backend.nn.flux", "IntegratedFluxTransformer2DModel"): "double_blocks"}
BLOCK_LISTS = ("joint_blocks", "double_blocks", "single_blocks")


def is_dit(diffusion_model) -> bool:
    """Whether `diffusion_model` is ComfyUI's SD3 / SD3.5 MMDiT or Flux, or Forge's Flux (the classes themselves)."""
    return (type(diffusion_model).__module__, type(diffusion_model).__name__) in MODELS


def dit_swaps(root, host_path: Callable[[nn.Module], bool], resolve: ldm_swaps.Resolve | None = None,
              attention: Callable | None = None) -> tuple[dict[str, object], list[str]]:
    """({dotted path: copy} for root's blocks that take modules/comfy_dit.py's forwards, [what stays the host's and
    why, one line per reason]). `host_path(linear)`: the host casts or patches that Linear's weight per call.
    `attention`: dit_block_copy's, for Forge's Flux blocks (ComfyUI's take the node's attention override)."""
    modules = ldm_swaps.original_modules(root, resolve)
    swaps, left = {}, Counter()
    for path, module in modules.items():
        if block_kind(module) is None:
            continue
        problem = block_problem(module)
        if problem:
            left[f"{type(module).__name__}: {problem}"] += 1
        else:
            swaps[path] = dit_block_copy(module, host_path, attention)
    for name in BLOCK_LISTS:  # what sits where ComfyUI's blocks sit, of another class (another node's, a new block)
        blocks = modules.get(name)
        for index in range(len(blocks) if isinstance(blocks, nn.ModuleList) else 0):
            block = modules.get(f"{name}.{index}")
            if block is not None and block_kind(block) is None:
                left[f"{type(block).__name__} in {name}: not a block rocm_sd knows"] += 1
    notes = [f"{count} block{'s' if count > 1 else ''} left as they are ({why})" for why, count in left.items()]
    if swaps and "comfy_kitchen" in sys.modules:
        notes.append(f"comfy-kitchen is loaded: in the {len(swaps)} blocks rocm_sd runs, its AdaLN, Q / K RMSNorm and "
                     "rope replace ComfyUI's (comfy-kitchen's there among them); the blocks' linear layers (quantized "
                     "ones too) stay ComfyUI's and comfy-kitchen's, and attention goes to rocm_sd only where it chose "
                     "its own kernel, else to ComfyUI's attention")
    return swaps, notes
