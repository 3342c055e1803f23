"""Reversible edits of a model: every change records how to undo itself."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

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

    def replace_child(self, parent: nn.Module, name: str, new: nn.Module) -> None:
        old = getattr(parent, name)
        setattr(parent, name, new)
        self.undo.append(lambda: setattr(parent, name, old))

    def add_hook(self, handle) -> None:
        self.undo.append(handle.remove)

    def revert(self) -> None:
        while self.undo:
            self.undo.pop()()
