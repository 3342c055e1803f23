"""Whether a fused forward may read a submodule's weights instead of calling it.

The patched forwards (fused resnet, transformer block, upsampling, GEGLU projection) read some submodules'
weights and run one kernel for several of them. That is only the same computation while the submodule's call is
its class's forward and nothing else; callers add the type check (a LoRA loaded after optimize() puts PEFT's
wrapper module in the submodule's place, which fails it).
"""
from __future__ import annotations

from torch import nn


def accelerate_hooked(module: nn.Module) -> bool:
    """accelerate's hook is on the module (diffusers' enable_*_cpu_offload): its weights come to the GPU at its own
    call and, with sequential offload, sit on the meta device in between."""
    return hasattr(module, "_hf_hook")


def called_plainly(module: nn.Module) -> bool:
    """No forward hooks, forward pre-hooks or accelerate hook: calling the module is running its class's forward."""
    return not (module._forward_hooks or module._forward_pre_hooks or accelerate_hooked(module))
