"""Chooses, per op call, between the rocm_sd kernel and the PyTorch reference, and counts.

The rule (docs/design.md, convention 3):
  - a backend forced by name wins; then the tuning database's choice for the call's shape (tune/);
  - the kernel runs when its op's `supports()` gives no reason against it;
  - otherwise the call falls back to the reference, and each distinct reason is logged once;
  - ROCM_SD_STRICT=1 turns a fallback into an error that lists the reasons;
  - a backend asked for by name (ROCM_SD_BACKEND, or `force_backend`) raises when it cannot run.
"""
from __future__ import annotations

import collections
import contextlib
import logging
from typing import Callable, Protocol

from . import config

KERNEL, TORCH = config.BACKENDS
BACKENDS = config.BACKENDS
# Tuned choices "ck:<instance>" name a Composable Kernel instance built into _C (ROCm builds with CK,
# ck_templates/): rocm_sd's kernels too, so they run and are counted as KERNEL.
CK = "ck"
# Ops that exist to host a CK fusion (linear_geglu, conv_bias_residual) count their default path, the vendor
# GEMM / convolution followed by a rocm_sd epilogue op (counted under its own name as well), as "composed".
COMPOSED = "composed"


def torch_variant(choice: str | None) -> str | None:
    """The PyTorch path a tuned "torch:<variant>" choice names (attention: one SDPA backend), "" for plain
    "torch", None for any other choice."""
    prefix, _, name = (choice or "").partition(":")
    return name if prefix == TORCH else None


def ck_instance(choice: str | None) -> str | None:
    """The instance a tuned "ck:<instance>" choice names, or None for any other choice."""
    prefix, _, name = (choice or "").partition(":")
    return name if prefix == CK and name else None

log = logging.getLogger("rocm_sd")

_counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_logged: set[tuple[str, str]] = set()
_forced: dict[str, str] = {}


class FallbackError(RuntimeError):
    """Raised in strict mode, or for a forced backend, when the kernel cannot run a call."""


def forced_backend(op: str) -> str | None:
    """The backend asked for by name for `op` (force_backend, ROCM_SD_BACKEND), or None."""
    # Both sources hold known backends only: force_backend checks its argument, config the environment's.
    return _forced.get(op) or config.current.forced_backends.get(op) or config.current.forced_backends.get("*")


def torch_chosen(op: str, tuned: str | None) -> bool:
    """Whether PyTorch runs this call by choice: forced by name, or the tuning database's measured `torch[:variant]`
    (no forced backend overriding it). Not a fallback: no notice, and fine in strict mode."""
    forced = forced_backend(op)
    return forced == TORCH or (forced is None and torch_variant(tuned) is not None)


def choose(op: str, reasons: list[str], tuned: str | None = None, counted_as: str = KERNEL) -> str:
    """Backend for one call of `op`, given the reasons the kernel cannot run it (empty: it can) and the
    tuning database's choice for its shape (`torch[:variant]`, `rocm_sd[:variant]`, or None when untuned). A tuned
    `torch` is a measured choice, not a fallback: it is counted as torch, with no notice, even in strict mode.
    A kernel-path call is counted as `counted_as` (the ops hosting CK fusions count their default path as
    COMPOSED)."""
    forced = forced_backend(op)
    if torch_chosen(op, tuned):
        backend = TORCH
    elif not reasons:
        backend = KERNEL
    elif forced == KERNEL:
        raise FallbackError(f"rocm_sd::{op}: backend {KERNEL!r} was requested but cannot run: " + "; ".join(reasons))
    elif config.current.strict:
        raise FallbackError(f"rocm_sd::{op} would fall back to PyTorch (ROCM_SD_STRICT=1): " + "; ".join(reasons))
    else:
        backend = TORCH
        for reason in reasons:
            if (op, reason) not in _logged:
                _logged.add((op, reason))
                if config.current.log_fallbacks:
                    log.warning("rocm_sd::%s uses PyTorch: %s", op, reason)
    count(op, counted_as if backend == KERNEL else backend)
    return backend


# ---- the tuned choices: tune/active.py registers itself as their source when it is imported (rocm_sd/__init__
# imports it), so the ops ask the tuning database through here and never import tune/ ---------------------------

class TuningSource(Protocol):
    def tuned_choice(self, device, key_fn: Callable[[], str]) -> str | None: ...
    def chose_anywhere(self, device, op: str, backend: str, variants_only: bool = False) -> bool: ...


_tuning: TuningSource | None = None
_on_tuning_changed: list[Callable[[], None]] = []


def use_tuning(source: TuningSource) -> None:
    """Make `source` answer tuned_choice / chose_anywhere (tune/active.py, when it is imported)."""
    global _tuning
    _tuning = source
    tuning_changed()


def tuned_choice(device, key_fn: Callable[[], str]) -> str | None:
    """The tuning database's choice for the problem `key_fn()` on `device` (asked once per shape), or None."""
    return _tuning.tuned_choice(device, key_fn) if _tuning is not None else None


def chose_anywhere(device, op: str, backend: str, variants_only: bool = False) -> bool:
    """Whether `device`'s database chose `backend` (or only its "backend:..." variants) for any problem of `op`."""
    return _tuning is not None and _tuning.chose_anywhere(device, op, backend, variants_only)


def on_tuning_changed(callback: Callable[[], None]) -> None:
    """Run `callback` whenever the tuned choices may have changed (the ops drop their per-shape plans)."""
    _on_tuning_changed.append(callback)


def tuning_changed() -> None:
    for callback in _on_tuning_changed:
        callback()


def count(op: str, backend: str) -> None:
    """Count one call of `op` on `backend` (choose() does; so do callers that decided without it)."""
    _counts[op][backend] += 1


def fallback_reasons_seen() -> dict[str, list[str]]:
    seen: dict[str, list[str]] = collections.defaultdict(list)
    for op, reason in sorted(_logged):
        seen[op].append(reason)
    return dict(seen)


def stats() -> dict[str, dict[str, int]]:
    """Calls per op and backend since the last reset: {'group_norm': {'rocm_sd': 120, 'torch': 2}}."""
    return {op: dict(counter) for op, counter in _counts.items()}


def reset_stats() -> None:
    _counts.clear()


@contextlib.contextmanager
def force_backend(op: str, backend: str):
    """Run `op` on `backend` inside the block; the kernel backend raises if it cannot run a call."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    previous = _forced.get(op)
    _forced[op] = backend
    try:
        yield
    finally:
        if previous is None:
            _forced.pop(op, None)
        else:
            _forced[op] = previous
