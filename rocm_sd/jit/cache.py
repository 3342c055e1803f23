"""The disk cache of runtime-compiled kernels: one file per (source tree, compile options, arch, compiler and
runtime version), written atomically under a file lock, so that processes compiling the same kernels at once
(torchrun ranks, two ComfyUI workers) compile once and never read half a file. An entry that does not verify
(truncated, edited, written by another format) is moved aside and compiled again: a lost entry costs time, never
a wrong result."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable

from filelock import FileLock

from ..files import user_cache_dir, write_atomically
from .rtc import Compiled

FORMAT = 1  # bumped when the entry layout changes: old entries then simply miss
MAGIC = b"rocm_sd-jit\n"


def default_dir() -> Path:
    """$ROCM_SD_JIT_CACHE, else the platform's cache folder (as the tuning databases): ~/.cache/rocm_sd/jit."""
    from .. import config

    if config.current.jit_cache:
        return Path(config.current.jit_cache).expanduser()
    return user_cache_dir() / "jit"


def entry_key(unit: str, source_hash: str, options: list[str], arch: str, compiler: str, runtime: str) -> str:
    """File stem of an entry: readable unit and arch, then a hash of everything that changes the code."""
    digest = hashlib.sha256(json.dumps([FORMAT, unit, source_hash, options, arch, compiler, runtime]).encode())
    return f"{unit}-{arch}-{digest.hexdigest()[:24]}"


def _encode(compiled: Compiled) -> bytes:
    header = json.dumps({"lowered": compiled.lowered, "compiler": compiled.compiler, "seconds": compiled.seconds,
                         "code_sha256": hashlib.sha256(compiled.code).hexdigest(), "code_bytes": len(compiled.code)})
    return MAGIC + header.encode() + b"\n" + compiled.code


def _decode(data: bytes) -> Compiled:
    """The entry's contents; ValueError when they do not verify."""
    if not data.startswith(MAGIC):
        raise ValueError("not a rocm_sd JIT cache entry")
    header_line, sep, code = data[len(MAGIC):].partition(b"\n")
    if not sep:
        raise ValueError("truncated header")
    try:
        header = json.loads(header_line)
        lowered, expected_sha, expected_bytes = header["lowered"], header["code_sha256"], header["code_bytes"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"unreadable header ({error})") from None
    if len(code) != expected_bytes or hashlib.sha256(code).hexdigest() != expected_sha:
        raise ValueError("code does not match its checksum")
    return Compiled(code, dict(lowered), compiler=header.get("compiler", ""), seconds=header.get("seconds", 0.0))


class KernelCache:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder is not None else default_dir()

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.bin"

    def _read(self, key: str) -> Compiled | None:
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return _decode(data)
        except ValueError as error:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}-{os.getpid()}")
            os.replace(path, aside)
            import logging

            logging.getLogger("rocm_sd").warning("rocm_sd: JIT cache entry %s is damaged (%s); moved to %s and "
                                                 "compiling again", path, error, aside.name)
            return None

    def get(self, key: str, build: Callable[[], Compiled]) -> tuple[Compiled, bool]:
        """(the entry for `key`, whether it came from disk); `build()` makes it when missing or damaged. The lock
        makes a second process wait for the first one's compile instead of repeating it."""
        cached = self._read(key)
        if cached is not None:
            return cached, True
        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path(key)) + ".lock"):
            cached = self._read(key)  # another process may have written it while we waited
            if cached is not None:
                return cached, True
            compiled = build()
            write_atomically(self.path(key), lambda f: f.write(_encode(compiled)), lock_held=True)
            return compiled, False
