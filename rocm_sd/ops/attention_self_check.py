"""The self-check of rocm_sd's attention kernel on a GPU, before the kernel runs untuned calls there.

Where PyTorch's SDPA has no fused kernel for a call (it would take its math path), ops/attention.py runs rocm_sd's
kernel without a tuning database. The tuner validates every candidate against a float64 truth before choosing it;
this check does the same for that default. The first such call of a dtype and head dim on a GPU runs the kernel at
CASES (a long query run over an awkward number of keys, a packed QKV projection over 77 text tokens, batch 3 with
lengths no tile divides) against SDPA in float64, poisoned outputs, within the tolerance of the tests
(ops/_common.py). The answer is kept in the user's cache folder, keyed by the GPU (name and architecture) and the
kernels (built or runtime-compiled, the build's platform, targets and runtime, the kernel-source hash, rocm_sd's
version): a new build or changed sources check again. A check that fails keeps that dtype and head dim on PyTorch's
path on that GPU, with one warning naming the GPU, the head dim and the error.

Checked per head dim, not for all at once: runtime-compiled kernels (rocm_sd/jit/) are compiled per padded head
dim at first use, and a check of every head dim the kernel holds would compile them all.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Callable

import torch
from filelock import FileLock

from .. import _ext, platform
from ..files import user_cache_dir, write_json_atomically
from ..version import __version__
from ._common import within_tolerance

log = logging.getLogger("rocm_sd")

FORMAT = 1  # bumped when the file's layout changes: an older file then reads as absent
LOCK_TIMEOUT_S = 10.0
# (batch, q_len, kv_len, heads, packed QKV): 2048 queries over 197 keys take the instances of two query tiles a
# wave (hip/attention/attention.hip, pick_instance) and a partial key tile; 77 keys the tiles of 32 keys.
CASES = ((1, 2048, 197, 1, False), (2, 77, 77, 3, True), (3, 130, 333, 2, False))

_results: dict[tuple, dict] = {}  # (device, dtype, head dim) -> the stored entry: {"ok", "error", ...}
_unwritable: set[Path] = set()


def cache_path() -> Path:
    """~/.cache/rocm_sd/attention_self_check.json (the folder of the tuning databases and JIT kernels)."""
    return user_cache_dir() / "attention_self_check.json"


def device_identity(device: torch.device) -> dict:
    """What a result holds for: the GPU (name, architecture with target features) and the kernels that ran."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = props.name
        arch = (getattr(props, "gcnArchName", "") if platform.torch_gpu_platform() == "hip" else "") or \
            platform.device_arch(device)
    else:
        name = arch = device.type
    return {"device": name, "arch": arch, "kernels": _ext.source(), "build": _ext.build_info() or {},
            "rocm_sd": __version__}


def _identity_key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _gpu_name(device: torch.device, identity: dict) -> str:
    return f"GPU {device.index if device.index is not None else 0} ({identity['device']}, {identity['arch']})"


def result(device: torch.device, dtype: torch.dtype, head_dim: int, kernel: Callable, reference: Callable) -> dict:
    """The check's entry for this GPU, dtype and head dim ({"ok": bool, "error": str, ...}): this process's answer,
    else the cache file's, else the check is run now and stored. Inside a graph capture, where nothing may
    synchronise, an unchecked head dim reads as not passed, and is checked at the next call outside one."""
    key = (device, dtype, head_dim)
    entry = _results.get(key)
    if entry is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return {"ok": False, "error": "not checked yet (a graph capture is in progress)"}
        entry = _results[key] = _stored_or_checked(device, dtype, head_dim, kernel, reference)
    return entry


def passed(device: torch.device, dtype: torch.dtype, head_dim: int, kernel: Callable, reference: Callable) -> bool:
    return result(device, dtype, head_dim, kernel, reference)["ok"]


def known(device: torch.device, dtype: torch.dtype, head_dim: int) -> dict | None:
    """This process's entry for this GPU, dtype and head dim, or None before the check was asked for (runs nothing)."""
    return _results.get((device, dtype, head_dim))


def failed(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether this process already knows the check failed here (asks nothing, runs nothing)."""
    entry = known(device, dtype, head_dim)
    return entry is not None and not entry["ok"]


def forget() -> None:
    """Drop this process's answers (tests; the cache file stays)."""
    _results.clear()


def _stored_or_checked(device, dtype, head_dim, kernel, reference) -> dict:
    identity = device_identity(device)
    path, group = cache_path(), f"{str(dtype).removeprefix('torch.')} d{head_dim}"
    entry = _read(path).get(_identity_key(identity), {}).get("checks", {}).get(group)
    if not _valid_entry(entry):
        start = time.perf_counter()
        error = run_check(device, dtype, head_dim, kernel, reference)
        entry = {"ok": not error, "error": error, "seconds": round(time.perf_counter() - start, 3),
                 "checked": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        _store(path, identity, group, entry)
    if not entry["ok"]:
        log.warning("rocm_sd: the attention kernel failed its self-check on %s at head dim %d (%s): %s. Untuned "
                    "calls SDPA has no fused kernel for stay on PyTorch's path there (result kept in %s)",
                    _gpu_name(device, identity), head_dim, str(dtype).removeprefix("torch."), entry["error"], path)
    return entry


def run_check(device: torch.device, dtype: torch.dtype, head_dim: int, kernel: Callable, reference: Callable) -> str:
    """'' when kernel(q, k, v, scale, out=...) matches reference() in float64 at every case, else what went wrong at
    the first case that failed."""
    generator = torch.Generator(device=device).manual_seed(0)
    scale = head_dim ** -0.5

    def rand(*shape):
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    for batch, q_len, kv_len, heads, packed in CASES:
        shape = (batch, q_len, kv_len, heads, head_dim)
        if packed:
            q, k, v = rand(batch, q_len, 3, heads, head_dim).unbind(2)
        else:
            q, k, v = rand(batch, q_len, heads, head_dim), rand(batch, kv_len, heads, head_dim), \
                rand(batch, kv_len, heads, head_dim)
        try:
            out = kernel(q, k, v, scale, out=torch.full(q.shape, float("nan"), device=device, dtype=dtype))
            truth = reference(q.double(), k.double(), v.double(), scale)
            ok, err, allowed = within_tolerance(out, truth, reference(q, k, v, scale))
        except Exception as error:  # noqa: BLE001 - whatever the kernel raises, it failed the check
            return f"(batch, q_len, kv_len, heads, head_dim) {shape}: {type(error).__name__}: {error}"
        if not ok:
            return f"(batch, q_len, kv_len, heads, head_dim) {shape}: max error {err:.3g} > allowed {allowed:.3g}"
    return ""


def _valid_entry(entry) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("ok"), bool) and isinstance(entry.get("error"), str)


def _read(path: Path) -> dict:
    """{identity key: {"identity", "checks": {group: entry}}}; {} for a missing file and for one this module did
    not write or cannot read (a corrupt file reads as absent: the checks run again and replace it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    # ValueError: malformed JSON (UnicodeDecodeError is one); RecursionError: nested deeper than the parser's stack.
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("devices"), dict):
        return {}
    return {key: device for key, device in data["devices"].items()
            if isinstance(device, dict) and isinstance(device.get("checks"), dict)}


def _store(path: Path, identity: dict, group: str, entry: dict) -> None:
    """Merge `entry` into the file under its lock (other GPUs' and processes' entries kept), replacing it atomically.
    A cache that cannot be written gets one warning: the check then runs again in the next process."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
            devices = _read(path)
            mine = devices.setdefault(_identity_key(identity), {"identity": identity, "checks": {}})
            mine["checks"][group] = entry
            write_json_atomically(path, {"format": FORMAT, "devices": devices}, lock_held=True)
    except OSError as error:  # read-only or full disk, a folder at the path; filelock's Timeout is an OSError too
        if path not in _unwritable:
            _unwritable.add(path)
            log.warning("rocm_sd: cannot write the attention self-check cache %s (%s); the check runs again in the "
                        "next process", path, error)
