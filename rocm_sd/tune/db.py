"""The tuning database: one JSON file per device, read once, looked up per call, never corrupted or lost.

Where: $ROCM_SD_TUNE_DB (a folder, or one .json file), else the platform's cache folder
(~/.cache/rocm_sd/tune, $XDG_CACHE_HOME/rocm_sd/tune, %LOCALAPPDATA%\\rocm_sd\\tune); the file is named by
the device key (device_keys.py). A read-only default database shipped in rocm_sd/tune/defaults/ (heuristic
choices for known architectures) answers what the user's file does not: the user's results always win.

A file holds one table per (device, software) pair (two, from a hand- or sync-merged file, are read as one and
written back as one): results count only for the device and the software
(validators: rocm_sd, kernel sources, runtime, driver, torch) they were measured with. ComfyUI's torch and
the CLI's, or two GPUs sharing one .json file, each read and write their own table and never evict
another's. A process whose software has no table yet says what the nearest table was measured with
(ROCM_SD_TUNE_ACCEPT_STALE=1 uses that one anyway).

Writes hold a file lock (several ranks of a torchrun job, ComfyUI and the CLI may tune at once), merge with
what is on disk, and replace the file atomically through one temporary name that only the lock holder
uses, so a killed writer leaves no partial database and at most one temporary file, which the next write
replaces. A result is saved when record() returns; inside batched() results are saved together every few
seconds and when the block ends. A corrupt file is moved aside under the lock (a unique name, never over
another file) with a warning, never deleted; a path that is not a regular file is never touched.

Keys are problem strings, `op|dtype|layout|name=value,...` (ops/spec.py's problem_key()); a lookup that misses falls
back to the nearest tuned shape of the same op, dtype and layout (log-distance over the numeric values),
then to None: the op's own heuristic decides.
"""
from __future__ import annotations

import contextlib
import datetime
import glob
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from filelock import FileLock, Timeout

from .. import config
from ..files import user_cache_dir, write_json_atomically
from .device_keys import DeviceKey

log = logging.getLogger("rocm_sd")

FORMAT = 2          # {"format": 2, "tables": [{"device", "validators", "written", "results"}, ...]}
LEGACY_FORMAT = 1   # {"format": 1, "device", "validators", "results"}: read as one table, rewritten as format 2
LOCK_TIMEOUT_S = 120.0
# A reader only takes the lock to move a corrupt file aside: inference must not wait long for that.
READ_LOCK_TIMEOUT_S = 10.0
BATCH_INTERVAL_S = 10.0
DEFAULTS_DIR = Path(__file__).with_name("defaults")


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
            if x <= 0 or y <= 0 or not math.isfinite(x) or not math.isfinite(y):
                return math.inf
            total += abs(math.log(x / y))
    return total


def default_location() -> Path:
    """The folder (or file) for user databases, by platform convention unless ROCM_SD_TUNE_DB says."""
    if config.current.tune_db:
        return Path(config.current.tune_db).expanduser()
    return user_cache_dir() / "tune"


def _file_for(location: Path, device: DeviceKey) -> Path:
    return location if location.suffix == ".json" else location / f"{device.file_stem}.json"


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


class DatabaseError(RuntimeError):
    """A tuning result could not be saved (lock held too long, folder not writable, path not a file)."""


# ---- the file format ---------------------------------------------------------------------------

@dataclass
class _Read:
    """What reading a database path found: tables, nothing (no file), or why it cannot be used."""
    tables: list[dict] | None = None
    corrupt: str | None = None      # the content is not a database: move it aside
    unreadable: str | None = None   # the path cannot be read (a folder, permissions): leave it alone


def _table_problem(table) -> str | None:
    """Why `table` is not a valid table, or None."""
    if not isinstance(table, dict):
        return "a table is not an object"
    for part in ("device", "validators", "results"):
        if not isinstance(table.get(part), dict):
            return f"missing or malformed {part!r}"
    for key, result in table["results"].items():
        choice = result.get("choice") if isinstance(result, dict) else None
        if not isinstance(choice, str) or not choice:
            return f"result {key[:80]!r} has no choice (a non-empty string)"
    return None


def _tables_of(data) -> tuple[list[dict] | None, str | None]:
    """The tables of a parsed file of either format, or (None, why it is not a database)."""
    if not isinstance(data, dict):
        return None, "not a rocm_sd tuning database (not a JSON object)"
    if data.get("format") == LEGACY_FORMAT:
        tables = [{"device": data.get("device"), "validators": data.get("validators", {}),
                   "results": data.get("results")}]
    elif data.get("format") == FORMAT:
        tables = data.get("tables")
        if not isinstance(tables, list):
            return None, "not a rocm_sd tuning database (no list of tables)"
    else:
        return None, f"format {str(data.get('format'))[:40]!r}, this rocm_sd reads formats {LEGACY_FORMAT} and {FORMAT}"
    for table in tables:
        problem = _table_problem(table)
        if problem:
            return None, f"not a rocm_sd tuning database ({problem})"
    return tables, None


def _read(path: Path) -> _Read:
    if not path.exists() and not path.is_symlink():
        return _Read()
    if not path.is_file():
        return _Read(unreadable="not a regular file")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return _Read()
    except OSError as exc:
        return _Read(unreadable=f"{type(exc).__name__}: {exc}")
    # ValueError covers malformed JSON and integers longer than Python's digit limit; RecursionError, JSON nested
    # deeper than the parser's stack.
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return _Read(corrupt=f"{type(exc).__name__}: {str(exc)[:200]}")
    tables, problem = _tables_of(data)
    return _Read(corrupt=problem) if problem else _Read(tables=tables)


def _merged_results(tables: list[dict]) -> dict[str, dict]:
    """The results of tables that answer for the same device and software: for a problem more than one
    measured, the latest measurement (the later table where the times are equal or missing)."""
    merged: dict[str, dict] = {}
    for table in tables:
        for key, result in table["results"].items():
            if key not in merged or str(result.get("measured", "")) >= str(merged[key].get("measured", "")):
                merged[key] = result
    return merged


def _unique_aside(path: Path, why: str) -> Path:
    """A name beside `path` that no file has: the time to the microsecond, then a counter."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    aside, n = path.with_name(f"{path.name}.{why}-{stamp}"), 1
    while aside.exists() or aside.is_symlink():
        aside, n = path.with_name(f"{path.name}.{why}-{stamp}-{n}"), n + 1
    return aside


FROM_CONFIG = "from config"  # TuningDB's default defaults_dir: DEFAULTS_DIR unless ROCM_SD_TUNE_DEFAULTS=0


class TuningDB:
    """Tuning results of one device: the user's table over the shipped defaults."""

    def __init__(self, device: DeviceKey, validators: dict[str, str], location: Path | None = None,
                 defaults_dir: Path | str | None = FROM_CONFIG, accept_stale: bool | None = None):
        if defaults_dir == FROM_CONFIG:
            defaults_dir = DEFAULTS_DIR if config.current.tune_defaults else None
        self.device, self.validators = device, dict(validators)
        self.path = _file_for(location or default_location(), device)
        self.accept_stale = config.current.tune_accept_stale if accept_stale is None else accept_stale
        self.notes: list[str] = []   # what happened to the files on loading: for `info` and the tuner
        self.results: dict[str, dict] = self._load_user() or {}
        defaults = defaults_dir / f"{device.file_stem}.json" if defaults_dir is not None else None
        # Shipped defaults are heuristics, not measurements of this software: only the device must match.
        self.defaults: dict[str, dict] = (self._load_shipped(defaults) or {}) if defaults else {}
        self._nearest: dict[str, str | None] = {}
        self._pending: dict[str, dict] | None = None   # results queued inside batched()
        self._batch_interval_s = BATCH_INTERVAL_S
        self._last_save = 0.0

    # ---- reading ------------------------------------------------------------------------------

    def _lock(self, timeout: float) -> FileLock:
        return FileLock(str(self.path) + ".lock", timeout=timeout)

    def _load_user(self) -> dict[str, dict] | None:
        read = _read(self.path)
        if read.corrupt:
            read = self._set_aside_if_still_corrupt(read.corrupt)
        if read.unreadable:
            self._note(f"tuning database {self.path} is {read.unreadable}; not used")
        return self._pick(read.tables, self.path, check_validators=True) if read.tables is not None else None

    def _load_shipped(self, path: Path) -> dict[str, dict] | None:
        read = _read(path)
        if read.corrupt or read.unreadable:  # inside the installed package: report, never rename
            self._note(f"shipped tuning defaults {path} not used: {read.corrupt or read.unreadable}")
            return None
        return self._pick(read.tables, path, check_validators=False) if read.tables is not None else None

    def _set_aside_if_still_corrupt(self, why: str) -> _Read:
        """Under the lock, read again (a writer may have replaced the file since) and move it aside only if it
        is still corrupt: a reader must never rename the database a writer has just written."""
        try:
            with self._lock(READ_LOCK_TIMEOUT_S):
                again = _read(self.path)
                if again.corrupt:
                    self._set_aside(again.corrupt)
                    return _Read()
                return again
        except Timeout:
            self._note(f"tuning database {self.path} is corrupt ({why}); not used (another process holds its lock, "
                       "so it is left in place)")
        except OSError as exc:
            self._note(f"tuning database {self.path} is corrupt ({why}) and could not be moved aside ({exc}); not used")
        return _Read()

    def _set_aside(self, why: str) -> None:
        """Move the corrupt file to a name no file has. The caller holds the lock."""
        aside = _unique_aside(self.path, "corrupt")
        os.replace(self.path, aside)
        self._note(f"tuning database {self.path} was corrupt ({why}); moved to {aside}, starting fresh")

    def _device_mismatch(self, table: dict) -> list[str]:
        return [f"device {k} {table['device'].get(k)!r} (this one: {v!r})"
                for k, v in self.device.as_dict().items() if table["device"].get(k) != v]

    def _software_mismatch(self, table: dict) -> list[str]:
        return [f"{k} {table['validators'].get(k)!r} (now {v!r})"
                for k, v in self.validators.items() if table["validators"].get(k) != v]

    def _pick(self, tables: list[dict], path: Path, check_validators: bool) -> dict[str, dict] | None:
        """The results of the table measured on this device (and, with check_validators, this software)."""
        same_device = [t for t in tables if not self._device_mismatch(t)]
        exact = [t for t in same_device if not (check_validators and self._software_mismatch(t))]
        if exact:
            return _merged_results(exact)
        if not tables:
            return None
        nearest = max(same_device, key=lambda t: str(t.get("written", ""))) if same_device else tables[-1]
        wrong = self._device_mismatch(nearest) + (self._software_mismatch(nearest) if check_validators else [])
        if same_device and self.accept_stale:
            self._note(f"using stale tuning results in {path} (ROCM_SD_TUNE_ACCEPT_STALE=1): {'; '.join(wrong)}")
            return _merged_results([t for t in same_device if t["validators"] == nearest["validators"]])
        self._note(f"ignoring tuning results in {path}: measured with {'; '.join(wrong)}. Tune again "
                   "(python -m rocm_sd.tune), or set ROCM_SD_TUNE_ACCEPT_STALE=1 to use them anyway")
        return None

    def _note(self, message: str) -> None:
        self.notes.append(message)
        log.warning("rocm_sd: %s", message)

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

        return any(key.startswith(op + "|") and chosen(result["choice"])
                   for table in (self.results, self.defaults) for key, result in table.items())

    def __len__(self) -> int:
        return len(self.results)

    # ---- writing ------------------------------------------------------------------------------

    def record(self, key: str, result: dict) -> None:
        """Save one result: now (saved when this returns), or inside batched() with the batch."""
        stamped = {key: self._stamped(key, result)}
        if self._pending is None:
            self.record_many(stamped)
            return
        self._pending.update(stamped)
        self.results.update(stamped)  # visible to lookups now, saved with the batch
        self._nearest.clear()
        if time.monotonic() - self._last_save >= self._batch_interval_s:
            self.flush()

    @contextlib.contextmanager
    def batched(self, interval_s: float = BATCH_INTERVAL_S) -> Iterator[TuningDB]:
        """record() inside the block saves every `interval_s` seconds and when the block ends (an error or Ctrl-C
        included): a tuning run takes the lock a few times instead of once per result, which is what keeps
        many processes tuning into one file fast. A kill -9 loses at most the results of the last interval,
        none that a save had returned for."""
        if self._pending is not None:
            raise RuntimeError("TuningDB.batched() is not reentrant")
        self._pending, self._batch_interval_s, self._last_save = {}, interval_s, time.monotonic()
        try:
            yield self
        finally:
            try:
                self.flush()
            finally:
                self._pending = None

    def flush(self) -> None:
        """Save the results queued by batched() now."""
        if self._pending:
            self.record_many(self._pending)
            self._pending.clear()
        self._last_save = time.monotonic()

    def record_many(self, results: Mapping[str, dict]) -> None:
        """Save results now, in one locked merge with the file as it is on disk (other writers' results and
        other devices' and software's tables kept), replacing the file atomically."""
        stamped = {key: self._stamped(key, result) for key, result in results.items()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock(LOCK_TIMEOUT_S):
                tables = self._tables_for_writing()
                mine = self._own_table(tables)
                mine["results"].update(stamped)
                mine["written"] = _now()
                self._write(tables)
        except Timeout as exc:
            raise DatabaseError(f"another process has held {self.path}.lock for over {LOCK_TIMEOUT_S:.0f} s; "
                                "if none is tuning, delete the lock file") from exc
        except OSError as exc:
            raise DatabaseError(f"cannot write the tuning database {self.path}: {exc}. Point ROCM_SD_TUNE_DB "
                                "at a writable folder") from exc
        self.results = {**mine["results"], **(self._pending or {})}
        self._nearest.clear()

    @staticmethod
    def _stamped(key: str, result: dict) -> dict:
        if not isinstance(key, str) or not isinstance(result, dict) or not isinstance(result.get("choice"), str) \
                or not result["choice"]:
            raise ValueError(f"a tuning result needs a string key and a 'choice' (a non-empty string): "
                             f"{key!r}: {result!r}")
        return {**result, "measured": result.get("measured", _now())}

    def _tables_for_writing(self) -> list[dict]:
        """The file's tables now (other writers' results included), or [] after moving a corrupt file aside.
        The caller holds the lock."""
        read = _read(self.path)
        if read.unreadable:
            raise DatabaseError(f"cannot write the tuning database {self.path}: it is {read.unreadable}. Move it "
                                "away, or point ROCM_SD_TUNE_DB at a folder or a .json file")
        if read.corrupt:
            self._set_aside(read.corrupt)
            return []
        return read.tables or []

    def _own_table(self, tables: list[dict]) -> dict:
        """This device's and software's table in `tables`, added if there is none. Several (a file merged by
        hand or by a sync tool) become the first of them holding all their results, as reading merges them."""
        mine = [t for t in tables if not self._device_mismatch(t) and not self._software_mismatch(t)]
        if not mine:
            mine = [{"device": self.device.as_dict(), "validators": self.validators, "results": {}}]
            tables.append(mine[0])
        mine[0]["results"] = _merged_results(mine)
        tables[:] = [t for t in tables if not any(t is other for other in mine[1:])]
        return mine[0]

    def _write(self, tables: list[dict]) -> None:
        """Replace the file. The caller holds the lock, so no other writer is between write and rename: a
        temporary file left here was left by a killed writer."""
        for orphan in self.path.parent.glob(glob.escape(self.path.name) + "*.tmp"):
            orphan.unlink(missing_ok=True)
        data = {"format": FORMAT,
                "tables": [{**t, "results": dict(sorted(t["results"].items()))} for t in tables]}
        write_json_atomically(self.path, data, lock_held=True)
