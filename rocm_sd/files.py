"""Files other processes may read while we write them: results, tuning databases."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_json_atomically(path: str | os.PathLike, data) -> None:
    """Temp file in the same folder + fsync + rename: a reader sees the old file or the new one, never
    half of one, and a crash at any point leaves no partial file behind."""
    path = Path(path)
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
