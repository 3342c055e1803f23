"""Files other processes may read while we write them: results, tuning databases."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_json_atomically(path: str | os.PathLike, data, lock_held: bool = False) -> None:
    """Temp file in the same folder + fsync + rename: a reader sees the old file or the new one, never half
    of one. With `lock_held` (the caller holds a lock every writer of `path` takes) the temporary file has
    one fixed name, `<name>.tmp`: a writer killed between write and rename leaves that one file, which the
    next write replaces, instead of a new uniquely named orphan per kill."""
    path = Path(path)
    if lock_held:
        tmp = str(path.with_name(path.name + ".tmp"))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    else:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
