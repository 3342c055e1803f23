"""Every ROCM_SD_* environment variable is read here, once, at import (call `refresh()` after changing one).

ROCM_SD_STRICT=1            any fallback to the PyTorch reference raises instead (GPU tests run this way)
ROCM_SD_BACKEND=op:backend  force a backend per op, comma-separated: `group_norm:torch` or `*:rocm_sd`.
                            A backend forced by name raises when it cannot run the call.
ROCM_SD_LOG=0               silence the one-line notice printed for each distinct fallback reason
ROCM_SD_TUNE_DB=PATH        where tuning databases live: a folder (one file per device) or one .json file
ROCM_SD_TUNE_ACCEPT_STALE=1 use a tuning database measured with other software (versions, driver) anyway
ROCM_SD_TUNE_DEFAULTS=0     do not read the default databases shipped in rocm_sd/tune/defaults/
ROCM_SD_KERNELS=auto|built|jit   where kernels come from: auto (default) takes _C where it has code for the GPU
                            and compiles the shipped sources at run time elsewhere (rocm_sd/jit/); built: _C only;
                            jit: always compile at run time (tests the JIT path on a GPU that _C covers)
ROCM_SD_JIT_CACHE=PATH      folder of the runtime-compiled kernels (default: the cache folder's rocm_sd/jit)
ROCM_SD_REPLACE_SDPA_MATH=0 untuned attention calls that SDPA has no fused kernel for stay on SDPA's math path
                            (default: rocm_sd's kernel runs them, after its self-check on the GPU: ops/attention.py)

Switches take 1/true/yes/on or 0/false/no/off (any case); empty is the default. A value that is none of these,
or a ROCM_SD_BACKEND that is not op:backend entries, gets one warning naming the variable and is ignored: the
default is used (an op ROCM_SD_BACKEND names twice gets a warning too, and its last entry applies). Not an error: these are read at `import rocm_sd`, inside ComfyUI, A1111 and user scripts, where
a typo in a setting must not stop the host application from starting; the defaults are what runs without the
variable, and the warning says what was not applied.
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger("rocm_sd")


@dataclass
class Config:
    strict: bool = False
    forced_backends: dict[str, str] = field(default_factory=dict)
    log_fallbacks: bool = True
    tune_db: str | None = None
    tune_accept_stale: bool = False
    tune_defaults: bool = True  # read the shipped default databases (rocm_sd/tune/defaults/) beneath the user's
    kernels: str = "auto"  # KERNEL_SOURCES: where kernels come from (_ext.py)
    jit_cache: str | None = None
    replace_sdpa_math: bool = True  # rocm_sd's attention kernel where SDPA would take its math path (ops/attention.py)


TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _ignored(name: str, value: str, accepted: str, default: str) -> None:
    log.warning("rocm_sd: ignoring %s=%r: %s; using the default (%s)", name, value, accepted, default)


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip()
    if value.lower() in TRUE + FALSE:
        return value.lower() in TRUE
    if value:
        _ignored(name, value, f"a switch is one of {', '.join(TRUE + FALSE)}", "on" if default else "off")
    return default


# The backends a name can force (dispatch.KERNEL, dispatch.TORCH): checked here, once, when the variable is read.
BACKENDS = ("rocm_sd", "torch")


def _parse_backends(spec: str) -> dict[str, str]:
    """{op: backend} from `op:backend,...`; ValueError naming the first entry of another form or backend. An op
    named twice gets a warning: the last entry applies, as it would on a command line."""
    forced, named = {}, {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        op, sep, backend = item.partition(":")
        if not sep or not op.strip() or not backend.strip():
            raise ValueError(f"entry {item!r} is not of the form op:backend")
        if backend.strip() not in BACKENDS:
            raise ValueError(f"entry {item!r} names backend {backend.strip()!r}, not one of {', '.join(BACKENDS)}")
        forced[op.strip()] = backend.strip()
        named.setdefault(op.strip(), []).append(item)
    for op, items in named.items():
        if len(items) > 1:
            log.warning("rocm_sd: ROCM_SD_BACKEND=%r names %s %d times (%s): the last, %s, applies", spec, op,
                        len(items), ", ".join(items), items[-1])
    return forced


KERNEL_SOURCES = ("auto", "built", "jit")


def _kernel_source() -> str:
    value = os.environ.get("ROCM_SD_KERNELS", "").strip().lower()
    if value in KERNEL_SOURCES:
        return value
    if value:
        _ignored("ROCM_SD_KERNELS", value, f"one of {', '.join(KERNEL_SOURCES)}", "auto")
    return "auto"


def _forced_backends() -> dict[str, str]:
    # All or nothing: applying the well-formed half of a list would run a mix the user never asked for.
    spec = os.environ.get("ROCM_SD_BACKEND", "")
    try:
        return _parse_backends(spec)
    except ValueError as error:
        _ignored("ROCM_SD_BACKEND", spec, f"{error}; give comma-separated op:backend entries, e.g. group_norm:torch "
                 "or *:rocm_sd", "no backend forced")
        return {}


def _from_env() -> Config:
    return Config(
        strict=_flag("ROCM_SD_STRICT", False),
        forced_backends=_forced_backends(),
        log_fallbacks=_flag("ROCM_SD_LOG", True),
        tune_db=os.environ.get("ROCM_SD_TUNE_DB") or None,
        tune_accept_stale=_flag("ROCM_SD_TUNE_ACCEPT_STALE", False),
        tune_defaults=_flag("ROCM_SD_TUNE_DEFAULTS", True),
        kernels=_kernel_source(),
        jit_cache=os.environ.get("ROCM_SD_JIT_CACHE") or None,
        replace_sdpa_math=_flag("ROCM_SD_REPLACE_SDPA_MATH", True),
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
