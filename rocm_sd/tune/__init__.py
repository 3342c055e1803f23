"""Tuning: per-device databases of the fastest implementation per op and shape (db.py, keyed by
device_key.py). `python -m rocm_sd.tune` will fill them; dispatch reads them."""
from .db import DatabaseError, TuningDB, default_location
from .device_key import DeviceKey, device_key, validators

__all__ = ["TuningDB", "DatabaseError", "default_location", "DeviceKey", "device_key", "validators"]
