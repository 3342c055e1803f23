"""The disk cache of runtime-compiled kernels: one file per (source tree, compile options, arch, compiler and
runtime version), written atomically under a file lock, so that processes compiling the same kernels at once
(torchrun ranks, two ComfyUI workers) compile once and never read half a file. An entry that does not verify
(truncated, edited, written by another format) is moved aside and compiled again: a lost entry costs time, never
a wrong result. A cache that cannot be used (a read-only or full disk, ROCM_SD_JIT_CACHE naming a file, an entry or
lock path that is a folder) gets one warning per path and the kernel is compiled in memory: the op goes on."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

from filelock import FileLock

from ..files import user_cache_dir, write_atomically
from .rtc import Compiled

log = logging.getLogger("rocm_sd")

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
    # RecursionError: a header nested deeper than the parser's stack.
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise ValueError(f"unreadable header ({type(error).__name__}: {str(error)[:200]})") from None
    if not isinstance(lowered, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in lowered.items()):
        raise ValueError("header's 'lowered' is not a map of names to symbols")
    if len(code) != expected_bytes or hashlib.sha256(code).hexdigest() != expected_sha:
        raise ValueError("code does not match its checksum")
    compiler, seconds = header.get("compiler", ""), header.get("seconds", 0.0)
    return Compiled(code, lowered, compiler=compiler if isinstance(compiler, str) else "",
                    seconds=float(seconds) if isinstance(seconds, (int, float)) else 0.0)


class KernelCache:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder is not None else default_dir()
        self._warned: set[Path] = set()  # paths already warned about: one warning each, not one per kernel

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.bin"

    def _warn_once(self, path: Path, message: str, *args) -> None:
        if path not in self._warned:
            self._warned.add(path)
            log.warning("rocm_sd: " + message + "; compiling in memory (the kernel is not cached)", *args)

    def _read(self, key: str) -> Compiled | None:
        path = self.path(key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # no entry, or no folder (get() says why it cannot make one)
            return None
        except OSError as error:  # a folder at the entry's path, permissions, I/O: not ours to move
            self._warn_once(path, "cannot read JIT cache entry %s (%s)", path, error)
            return None
        try:
            return _decode(data)
        except ValueError as error:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}-{os.getpid()}")
            try:
                os.replace(path, aside)
            except OSError as move_error:
                self._warn_once(path, "JIT cache entry %s is damaged (%s) and cannot be moved aside (%s)", path,
                                error, move_error)
                return None
            log.warning("rocm_sd: JIT cache entry %s is damaged (%s); moved to %s and compiling again", path, error,
                        aside.name)
            return None

    def get(self, key: str, build: Callable[[], Compiled]) -> tuple[Compiled, bool]:
        """(the entry for `key`, whether it came from disk); `build()` makes it when missing or damaged. The lock
        makes a second process wait for the first one's compile instead of repeating it. Where the cache cannot
        be used, `build()` makes it without the cache (a warning for each path that failed)."""
        cached = self._read(key)
        if cached is not None:
            return cached, True
        lock = FileLock(str(self.path(key)) + ".lock")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except OSError as error:  # read-only, not a folder, a folder at the lock's path
            self._warn_once(self.folder, "cannot use the JIT cache folder %s (%s)", self.folder, error)
            return build(), False
        try:
            cached = self._read(key)  # another process may have written it while we waited
            if cached is not None:
                return cached, True
            compiled = build()
            try:
                write_atomically(self.path(key), lambda f: f.write(_encode(compiled)), lock_held=True)
            except OSError as error:  # a full or read-only disk: this process still has the kernel
                self._warn_once(self.path(key), "cannot save JIT cache entry %s (%s)", self.path(key), error)
            return compiled, False
        finally:
            lock.release()
