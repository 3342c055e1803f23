"""Tuning: per-device databases of the fastest implementation per op and shape (db.py, keyed by
device_keys.py). `python -m rocm_sd.tune` fills them (cli.py, run.py); dispatch reads them (active.py). The names below
are imported at their first use: `python -m rocm_sd.tune --help` imports this package without importing torch."""
from .._lazy import lazy_attributes

__all__ = ["TuningDB", "DatabaseError", "default_location", "DeviceKey", "device_key", "validators"]
__getattr__, __dir__ = lazy_attributes(__name__, {
    "TuningDB": ".db", "DatabaseError": ".db", "default_location": ".db",
    "DeviceKey": ".device_keys", "device_key": ".device_keys", "validators": ".device_keys"})
