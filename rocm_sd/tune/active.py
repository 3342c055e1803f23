"""The tuned choices the ops dispatch by: each device's database loaded once, on first use.

Ops ask when they plan a new argument shape (their PlanCache), not per call, so a lookup costs nothing
on the hot path. reload() re-reads the databases and drops the ops' plans (after tuning in-process).
"""
from __future__ import annotations

import logging
import sys

import torch

from .. import dispatch

log = logging.getLogger("rocm_sd")

_databases: dict[int, object] = {}


def _database(index: int):
    if index not in _databases:
        from . import vendor
        from .db import TuningDB
        from .device_keys import device_key, validators

        try:
            db = _databases[index] = TuningDB(device_key(index), validators(index))
        except Exception as exc:  # noqa: BLE001 -- a broken database must never stop inference
            log.warning("rocm_sd: tuning database not used: %s: %s", type(exc).__name__, exc)
            _databases[index] = None
            return None
        try:  # ROCm: the vendor tuners' results beside the database (TunableOp, MIOpen find), use-only
            vendor.use_vendor_results(db.path.parent, db.device.file_stem)
        except Exception as exc:  # noqa: BLE001 -- nor must the vendors' files
            log.warning("rocm_sd: vendor tuning results not used: %s: %s", type(exc).__name__, exc)
    return _databases[index]


def load(device: torch.device) -> None:
    """Loads `device`'s database (and on ROCm the vendor tuners' results beside it) if not loaded yet."""
    _database(device.index if device.index is not None else torch.cuda.current_device())


def tuned_choice(device: torch.device, key_fn) -> str | None:
    """The tuned candidate name for the problem `key_fn()` on `device`, or None (untuned, or on a CPU)."""
    if device.type != "cuda":
        return None
    db = _database(device.index if device.index is not None else torch.cuda.current_device())
    if db is None or not (db.results or db.defaults):
        return None
    hit = db.lookup(key_fn())
    return hit["choice"] if hit else None


def chose_anywhere(device: torch.device, op: str, backend: str, variants_only: bool = False) -> bool:
    """Whether `device`'s database chose `backend` (or one of its variants, "backend:..."; only a variant with
    `variants_only`) for any problem of `op`."""
    if device.type != "cuda":
        return False
    db = _database(device.index if device.index is not None else torch.cuda.current_device())
    return db is not None and db.chose_anywhere(op, backend, variants_only)


def reload() -> None:
    _databases.clear()
    dispatch.tuning_changed()


dispatch.use_tuning(sys.modules[__name__])  # the ops' tuned choices come from here from now on
