"""Every ROCM_SD_* environment variable is read here, once, at import (call `refresh()` after changing one).

ROCM_SD_STRICT=1            any fallback to the PyTorch reference raises instead (GPU tests run this way)
ROCM_SD_BACKEND=op:backend  force a backend per op, comma-separated: `group_norm:torch` or `*:rocm_sd`.
                            A backend forced by name raises when it cannot run the call.
ROCM_SD_LOG=0               silence the one-line notice printed for each distinct fallback reason
ROCM_SD_TUNE_DB=PATH        where tuning databases live: a folder (one file per device) or one .json file
ROCM_SD_TUNE_ACCEPT_STALE=1 use a tuning database measured with other software (versions, driver) anyway
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field


@dataclass
class Config:
    strict: bool = False
    forced_backends: dict[str, str] = field(default_factory=dict)
    log_fallbacks: bool = True
    tune_db: str | None = None
    tune_accept_stale: bool = False
    tune_defaults: bool = True  # read the shipped default databases (rocm_sd/tune/defaults/) beneath the user's


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in ("0", "false", "no", "off")


def _parse_backends(spec: str) -> dict[str, str]:
    forced = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        op, sep, backend = item.partition(":")
        if not sep or not op or not backend:
            raise ValueError(f"ROCM_SD_BACKEND entry {item!r} is not of the form op:backend")
        forced[op.strip()] = backend.strip()
    return forced


def _from_env() -> Config:
    return Config(
        strict=_flag("ROCM_SD_STRICT", False),
        forced_backends=_parse_backends(os.environ.get("ROCM_SD_BACKEND", "")),
        log_fallbacks=_flag("ROCM_SD_LOG", True),
        tune_db=os.environ.get("ROCM_SD_TUNE_DB") or None,
        tune_accept_stale=_flag("ROCM_SD_TUNE_ACCEPT_STALE", False),
        tune_defaults=_flag("ROCM_SD_TUNE_DEFAULTS", True),
    )


current = _from_env()


def refresh() -> Config:
    """Re-read the environment."""
    global current
    current = _from_env()
    return current


@contextlib.contextmanager
def override(**changes):
    """Temporarily change settings: `with config.override(strict=True): ...`."""
    global current
    saved = current
    current = Config(**{**saved.__dict__, **changes})
    try:
        yield current
    finally:
        current = saved
