"""Files other processes may read while we write them: results, tuning databases."""
from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], object], durable: bool = True,
                     lock_held: bool = False) -> None:
    """write(file) into a temp file in the same folder, then rename it to `path`: a reader sees the old file
    or the new one, never half of one, and a process that ends at any point leaves no partial `path` (at
    most a stray temp file). `durable` syncs the data to disk before the rename, so that a power cut cannot
    leave an empty `path` either. With `lock_held` (the caller holds a lock every writer of `path` takes) the
    temporary file has one fixed name, `<name>.tmp`: a writer killed between write and rename leaves that one
    file, which the next write replaces, instead of a new uniquely named orphan per kill. The file gets the
    permissions open() would give it (0o666 less the umask), not mkstemp's private 0o600."""
    path = Path(path)
    if lock_held:
        tmp = str(path.with_name(path.name + ".tmp"))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o666)
    else:
        fd, tmp = _create_unique(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _create_unique(path: Path) -> tuple[int, str]:
    """A new file next to `path` that no other writer can have opened (O_EXCL), mode 0o666 less the umask."""
    while True:
        tmp = str(path.with_name(f"{path.name}{secrets.token_hex(4)}.tmp"))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue


def write_json_atomically(path: str | os.PathLike, data, lock_held: bool = False) -> None:
    write_atomically(path, lambda f: f.write(json.dumps(data, indent=1).encode("utf-8")), lock_held=lock_held)


def user_cache_dir() -> Path:
    """rocm_sd's folder in the platform's cache folder: ~/.cache/rocm_sd ($XDG_CACHE_HOME/rocm_sd),
    %LOCALAPPDATA%\\rocm_sd on Windows. Tuning databases and runtime-compiled kernels live below it."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "rocm_sd"
