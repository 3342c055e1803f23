"""rocm_sd's version and the source commit result rows record."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

__version__ = "0.1.0"  # pyproject.toml's version

# The folder above the package: the root of a checkout when rocm_sd runs from one.
SOURCE_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()


def git_commit() -> str:
    """$ROCM_SD_COMMIT where set (a device machine's copy of a working tree: git metadata that came with it may name
    an older commit than the tree it holds), else the commit of rocm_sd's own source checkout, else 'unknown'. Only
    a repository whose top level is the package's source root counts: an exported copy or an installed package
    inside someone else's repository must not record that repository's commit."""
    if os.environ.get("ROCM_SD_COMMIT"):
        return os.environ["ROCM_SD_COMMIT"]
    try:
        if Path(_git("rev-parse", "--show-toplevel")).resolve() == SOURCE_ROOT:
            return _git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"
