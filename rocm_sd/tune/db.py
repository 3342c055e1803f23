"""The tuning database: one JSON file per device, read once, looked up per call, never corrupted or lost.

Where: $ROCM_SD_TUNE_DB (a folder, or one .json file), else the platform's cache folder
(~/.cache/rocm_sd/tune, $XDG_CACHE_HOME/rocm_sd/tune, %LOCALAPPDATA%\\rocm_sd\\tune); the file is named by
the device key (device_key.py). A read-only default database shipped in rocm_sd/tune/defaults/ (heuristic
choices for known architectures) answers what the user's file does not: the user's results always win.

A file is used only when its device and validators match this process; otherwise it is ignored with a
message saying what differs (ROCM_SD_TUNE_ACCEPT_STALE=1 uses it anyway). Writes hold a file lock
(several ranks of a torchrun job, ComfyUI and the CLI may tune at once), merge with what is on disk, and
replace the file atomically (temp file + fsync + rename), one result at a time, so a killed tuner loses
nothing already measured. A corrupt file, or a stale one about to be overwritten, is moved aside with a
warning, never deleted.

Keys are problem strings, `op|dtype|layout|name=value,...` (problem_key()); a lookup that misses falls
back to the nearest tuned shape of the same op, dtype and layout (log-distance over the numeric values),
then to None: the op's own heuristic decides.
"""
from __future__ import annotations

import datetime
import json
import logging
import math
import os
import sys
from pathlib import Path

from filelock import FileLock, Timeout

from .. import config
from ..files import write_json_atomically
from .device_key import DeviceKey

log = logging.getLogger("rocm_sd")

FORMAT = 1
LOCK_TIMEOUT_S = 120.0
DEFAULTS_DIR = Path(__file__).with_name("defaults")


def problem_key(op: str, dtype: str, layout: str, **shape) -> str:
    """'group_norm|float16|nhwc|N=2,C=320,HW=4096,G=32,act=silu': the parameters in the order given."""
    return f"{op}|{dtype}|{layout}|" + ",".join(f"{k}={v}" for k, v in shape.items())


def _split_key(key: str) -> tuple[str, dict[str, str]]:
    head, _, params = key.rpartition("|")
    return head, dict(p.split("=", 1) for p in params.split(",") if "=" in p)


def _distance(a: dict[str, str], b: dict[str, str]) -> float:
    """Sum of |log(a/b)| over numeric parameters; infinite when any other parameter differs."""
    if a.keys() != b.keys():
        return math.inf
    total = 0.0
    for name, value in a.items():
        try:
            x, y = float(value), float(b[name])
        except ValueError:
            if value != b[name]:
                return math.inf
            continue
        if x != y:
            if x <= 0 or y <= 0:
                return math.inf
            total += abs(math.log(x / y))
    return total


def default_location() -> Path:
    """The folder (or file) for user databases, by platform convention unless ROCM_SD_TUNE_DB says."""
    if config.current.tune_db:
        return Path(config.current.tune_db).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "rocm_sd" / "tune"


def _file_for(location: Path, device: DeviceKey) -> Path:
    return location if location.suffix == ".json" else location / f"{device.file_stem}.json"


def _stamp() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


class DatabaseError(RuntimeError):
    """A tuning result could not be saved (lock held too long, folder not writable)."""


FROM_CONFIG = "from config"  # TuningDB's default defaults_dir: DEFAULTS_DIR unless ROCM_SD_TUNE_DEFAULTS=0


class TuningDB:
    """Tuning results of one device: the user's file over the shipped defaults."""

    def __init__(self, device: DeviceKey, validators: dict[str, str], location: Path | None = None,
                 defaults_dir: Path | str | None = FROM_CONFIG, accept_stale: bool | None = None):
        if defaults_dir == FROM_CONFIG:
            defaults_dir = DEFAULTS_DIR if config.current.tune_defaults else None
        self.device, self.validators = device, dict(validators)
        self.path = _file_for(location or default_location(), device)
        self.accept_stale = config.current.tune_accept_stale if accept_stale is None else accept_stale
        self.notes: list[str] = []   # what happened to the files on loading: for `info` and the tuner
        self.results: dict[str, dict] = self._load(self.path, check_validators=True) or {}
        defaults = defaults_dir / f"{device.file_stem}.json" if defaults_dir is not None else None
        # Shipped defaults are heuristics, not measurements of this software: only the device must match.
        self.defaults: dict[str, dict] = (self._load(defaults, check_validators=False) or {}) if defaults else {}
        self._nearest: dict[str, str | None] = {}

    # ---- reading ------------------------------------------------------------------------------

    def _read(self, path: Path) -> tuple[dict | None, str | None]:
        """(content, None), (None, None) when there is no file, or (None, why it is corrupt)."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None, None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
        if not isinstance(data, dict) or not isinstance(data.get("results"), dict) \
                or not isinstance(data.get("device"), dict) or not isinstance(data.get("validators", {}), dict) \
                or not all(isinstance(v, dict) and "choice" in v for v in data["results"].values()):
            return None, "not a rocm_sd tuning database (missing or malformed device/validators/results)"
        if data.get("format") != FORMAT:
            return None, f"format {data.get('format')!r}, this rocm_sd reads format {FORMAT}"
        return data, None

    def _mismatch(self, data: dict, check_validators: bool) -> list[str]:
        wrong = [f"device {k} {data['device'].get(k)!r} (this one: {v!r})"
                 for k, v in self.device.as_dict().items() if data["device"].get(k) != v]
        if check_validators:
            wrong += [f"{k} {data['validators'].get(k)!r} (now {v!r})"
                      for k, v in self.validators.items() if data["validators"].get(k) != v]
        return wrong

    def _load(self, path: Path, check_validators: bool) -> dict[str, dict] | None:
        data, corrupt = self._read(path)
        if corrupt:
            self._set_aside(path, "corrupt", corrupt)
            return None
        if data is None:
            return None
        wrong = self._mismatch(data, check_validators)
        if wrong and not (self.accept_stale and check_validators):
            self._note(f"ignoring tuning database {path}: measured with {'; '.join(wrong)}. Tune again "
                       "(python -m rocm_sd.tune), or set ROCM_SD_TUNE_ACCEPT_STALE=1 to use it anyway")
            return None
        if wrong:
            self._note(f"using stale tuning database {path} (ROCM_SD_TUNE_ACCEPT_STALE=1): {'; '.join(wrong)}")
        return data["results"]

    def _note(self, message: str) -> None:
        self.notes.append(message)
        log.warning("rocm_sd: %s", message)

    def _set_aside(self, path: Path, why: str, detail: str) -> None:
        aside = path.with_name(f"{path.name}.{why}-{_stamp()}")
        try:
            os.replace(path, aside)
        except OSError as exc:  # e.g. the shipped defaults in a read-only install: just do not use it
            self._note(f"tuning database {path} is {why} ({detail}) and could not be moved aside ({exc}); not used")
            return
        self._note(f"tuning database {path} was {why} ({detail}); moved to {aside}, starting fresh")

    # ---- lookups ------------------------------------------------------------------------------

    def lookup(self, key: str) -> dict | None:
        """The tuned result for `key`: exact (user, then shipped), else the nearest tuned shape, else None."""
        hit = self.results.get(key) or self.defaults.get(key)
        if hit is not None:
            return hit
        if key not in self._nearest:
            self._nearest[key] = self._find_nearest(key)
        near = self._nearest[key]
        return None if near is None else self.results.get(near) or self.defaults.get(near)

    def _find_nearest(self, key: str) -> str | None:
        head, params = _split_key(key)
        best, best_distance = None, math.inf
        for table in (self.results, self.defaults):
            for candidate in table:
                other_head, other = _split_key(candidate)
                if other_head == head:
                    d = _distance(params, other)
                    if d < best_distance:
                        best, best_distance = candidate, d
            if best is not None:
                return best  # the user's nearest over any shipped one
        return None

    def chose_anywhere(self, op: str, backend: str, variants_only: bool = False) -> bool:
        """Whether `backend` (or a variant of it, "backend:..."; only a variant with `variants_only`) won any
        problem of `op`, user or shipped."""
        def chosen(choice: str) -> bool:
            prefix, colon, _ = choice.partition(":")
            return prefix == backend and (bool(colon) or not variants_only)

        return any(key.startswith(op + "|") and chosen(str(result.get("choice", "")))
                   for table in (self.results, self.defaults) for key, result in table.items())

    def __len__(self) -> int:
        return len(self.results)

    # ---- writing ------------------------------------------------------------------------------

    def record(self, key: str, result: dict) -> None:
        """Save one result now: lock, merge with the file as it is on disk, replace atomically."""
        if "choice" not in result:
            raise ValueError("a tuning result needs a 'choice'")
        result = {**result, "measured": result.get("measured", datetime.datetime.now().isoformat(timespec="seconds"))}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S):
                on_disk = self._current_results_for_writing()
                on_disk[key] = result
                self._write(on_disk)
        except Timeout as exc:
            raise DatabaseError(f"another process has held {self.path}.lock for over {LOCK_TIMEOUT_S:.0f} s; "
                                "if none is tuning, delete the lock file") from exc
        except OSError as exc:
            raise DatabaseError(f"cannot write the tuning database {self.path}: {exc}. Point ROCM_SD_TUNE_DB "
                                "at a writable folder") from exc
        self.results = on_disk
        self._nearest.clear()

    def _current_results_for_writing(self) -> dict[str, dict]:
        """What the file holds now (other writers' results included), or {} after moving a bad file aside."""
        data, corrupt = self._read(self.path)
        if corrupt:
            self._set_aside(self.path, "corrupt", corrupt)
            return {}
        if data is None:
            return {}
        wrong = self._mismatch(data, check_validators=True)
        if wrong:  # its results belong to other software or another device: keep them, beside
            self._set_aside(self.path, "stale", "; ".join(wrong))
            return {}
        return dict(data["results"])

    def _write(self, results: dict[str, dict]) -> None:
        data = {"format": FORMAT, "device": self.device.as_dict(), "validators": self.validators,
                "results": dict(sorted(results.items()))}
        write_json_atomically(self.path, data)
