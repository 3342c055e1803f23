"""What the fused forwards share: whether they may read a submodule's weights instead of calling it, and the
tensors they derive from weights (cached per weight version).

The patched forwards (fused resnet, transformer block, upsampling, GEGLU projection) read some submodules'
weights and run one kernel for several of them. That is only the same computation while the submodule's call is
its class's forward and nothing else; callers add the type check (a LoRA loaded after optimize() puts PEFT's
wrapper module in the submodule's place, which fails it).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def accelerate_hooked(module: nn.Module) -> bool:
    """accelerate's hook is on the module (diffusers' enable_*_cpu_offload): its weights come to the GPU at its own
    call and, with sequential offload, sit on the meta device in between."""
    return hasattr(module, "_hf_hook")


def called_plainly(module: nn.Module) -> bool:
    """No forward hooks, forward pre-hooks or accelerate hook: calling the module is running its class's forward."""
    return not (module._forward_hooks or module._forward_pre_hooks or accelerate_hooked(module))


def derived(store: dict, name: str, sources: tuple, make: Callable[[], torch.Tensor], *extra) -> torch.Tensor:
    """make(), computed once and kept in store[name] until a source tensor (a weight or bias) is replaced or
    changed in place (its data pointer or version moves, e.g. a LoRA fused into it) or `extra` changes.
    For tensors derived from weights (folded kernels, summed biases) that patched forwards would otherwise
    recompute on every call. A call that needs gradients of a source gets make() afresh and keeps nothing: the
    result stays in autograd's graph (so make() must not detach)."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in sources):
        return make()
    key = tuple(None if t is None else (t.data_ptr(), t._version, t.dtype, t.device) for t in sources) + extra
    entry = store.get(name)
    if entry is None or entry[0] != key:
        with torch.no_grad():
            entry = store[name] = (key, make())
    return entry[1]
