"""Reversible edits of a model: every change records how to undo itself."""
from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

RECORD_ATTR = "_rocm_sd_record"


_MISSING = object()


@dataclass
class PatchRecord:
    """What optimize() did to one model: undo actions (run last-first), counts for the report, and the
    graphed calls installed on it (their live counters join the report)."""
    undo: list[Callable[[], None]] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    graphed: dict = field(default_factory=dict)

    def set_attr(self, obj, name: str, value) -> None:
        """Set an instance attribute; undo restores the previous instance attribute or removes it."""
        old = obj.__dict__.get(name, _MISSING)
        setattr(obj, name, value)
        self.undo.append(lambda: setattr(obj, name, old) if old is not _MISSING else delattr(obj, name))

    def replace_forward(self, module: nn.Module, forward: Callable, count: str, **state) -> None:
        """module.forward = `forward` bound to module, with fresh per-module `state` attributes (caches);
        undo removes both."""
        for name, value in state.items():
            self.set_attr(module, name, value)
        self.set_attr(module, "forward", types.MethodType(forward, module))
        self.counts[count] += 1

    def replace_child(self, parent: nn.Module, name: str, new: nn.Module) -> None:
        old = getattr(parent, name)
        setattr(parent, name, new)
        self.undo.append(lambda: setattr(parent, name, old))

    def add_hook(self, handle) -> None:
        self.undo.append(handle.remove)

    def revert(self) -> None:
        while self.undo:
            self.undo.pop()()


def derived(store: dict, name: str, sources: tuple, make: Callable[[], torch.Tensor], *extra) -> torch.Tensor:
    """make(), computed once and kept in store[name] until a source tensor (a weight or bias) is replaced or
    changed in place (its data pointer or version moves, e.g. a LoRA fused into it) or `extra` changes.
    For tensors derived from weights (folded kernels, summed biases) that patched forwards would otherwise
    recompute on every call."""
    key = tuple(None if t is None else (t.data_ptr(), t._version, t.dtype, t.device) for t in sources) + extra
    entry = store.get(name)
    if entry is None or entry[0] != key:
        entry = store[name] = (key, make())
    return entry[1]
