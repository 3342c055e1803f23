"""Reversible edits of a model: every change records how to undo itself."""
from __future__ import annotations

import functools
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from torch import nn

RECORD_ATTR = "_rocm_sd_record"


class _Missing:
    """'No instance attribute was there': one object, kept by copy.deepcopy and pickle (unlike object())."""
    def __reduce__(self):
        return "_MISSING"


_MISSING = _Missing()


def _refuse_closure(fn: Callable) -> None:
    if isinstance(fn, types.FunctionType) and fn.__closure__:
        raise TypeError(f"undo action {fn!r} is a closure: a copy of the model would undo the original")


def _restore_attr(obj, name: str, old) -> None:
    if old is _MISSING:
        delattr(obj, name)
    else:
        setattr(obj, name, old)


@dataclass
class PatchRecord:
    """What optimize() did to one model: undo actions (run last-first), counts for the report, and the
    graphed calls installed on it (their live counters join the report).

    Undo actions are data, `(function, args, kwargs)`, never closures, and functions installed on modules are
    `functools.partial`s, never bound methods of local functions: copy.deepcopy and pickle then carry a record
    whose every reference is remapped to the copy's own modules (the copy's memo maps each object an entry
    names), so reverting a copy never touches the original, and an optimized model pickles."""
    undo: list[tuple[Callable, tuple, dict]] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    graphed: dict = field(default_factory=dict)
    flags: dict = field(default_factory=dict)   # the optimize() keywords it was made with
    graph_pool: object = None  # graphs.GraphPool the graphed calls of one optimize() share (its models run in turn)
    skipped_options: dict = field(default_factory=dict)  # optimize() option -> why its patcher left the model as is
    forgets: list[Callable] = field(default_factory=list)  # what invalidate() clears beside the graphs (text_kv's)

    def on_revert(self, fn: Callable, *args, **kwargs) -> None:
        """Call fn(*args, **kwargs) on revert. `fn`: a module-level function or a method of an object the model
        holds (a closure would keep pointing at the original model in a copy)."""
        _refuse_closure(fn)
        self.undo.append((fn, args, kwargs))

    def on_invalidate(self, fn: Callable) -> None:
        """Call fn() on invalidate(): state derived from the model that, like a graph, outlives changes rocm_sd cannot
        see. `fn` as on_revert's."""
        _refuse_closure(fn)
        self.forgets.append(fn)

    def clear_graphs(self) -> None:
        """Drops the graphs of every graphed call (the next calls capture again)."""
        for call in self.graphed.values():
            call.clear()

    def invalidate(self) -> None:
        """rocm_sd.invalidate_graphs(): the graphs, and what on_invalidate registered."""
        self.clear_graphs()
        for fn in self.forgets:
            fn()

    def set_attr(self, obj, name: str, value) -> None:
        """Set an instance attribute; undo restores the previous instance attribute or removes it."""
        self.on_revert(_restore_attr, obj, name, obj.__dict__.get(name, _MISSING))
        setattr(obj, name, value)

    def bind(self, module: nn.Module, name: str, fn: Callable) -> None:
        """module.<name> = fn with `module` as its first argument (a method of this instance only)."""
        self.set_attr(module, name, functools.partial(fn, module))

    def replace_forward(self, module: nn.Module, forward: Callable, count: str, **state) -> None:
        """module.forward = `forward` bound to module, with fresh per-module `state` attributes (caches);
        undo removes both."""
        for name, value in state.items():
            self.set_attr(module, name, value)
        self.bind(module, "forward", forward)
        self.counts[count] += 1

    def replace_child(self, parent: nn.Module, name: str, new: nn.Module) -> None:
        self.on_revert(setattr, parent, name, getattr(parent, name))
        setattr(parent, name, new)

    def skip_option(self, option: str, why: str) -> None:
        """An option's patcher could not apply it to this model (no FP8 on the GPU, an unsupported UNet): the model
        stays as it was, report() and pipeline.skipped_options() say why."""
        self.skipped_options[option] = why
        self.counts[why] += 1

    def add_hook(self, handle) -> None:
        self.on_revert(handle.remove)

    def revert(self) -> None:
        while self.undo:
            fn, args, kwargs = self.undo.pop()
            fn(*args, **kwargs)
