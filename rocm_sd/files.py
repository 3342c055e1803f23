"""Files other processes may read while we write them: results, tuning databases."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], object], durable: bool = True) -> None:
    """write(file) into a temp file in the same folder, then rename it to `path`: a reader sees the old file
    or the new one, never half of one, and a process that ends at any point leaves no partial `path` (at
    most a stray temp file). `durable` syncs the data to disk before the rename, so that a power cut cannot
    leave an empty `path` either."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
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


def write_json_atomically(path: str | os.PathLike, data) -> None:
    write_atomically(path, lambda f: f.write(json.dumps(data, indent=1).encode("utf-8")))
