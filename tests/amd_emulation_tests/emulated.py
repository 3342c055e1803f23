"""What the tests of the emulated kernel families share: their marks, the architectures, and loading a family's
library with its C entry points (tests/amd_emulation/entry_<family>.cpp).

Each test module names its libraries in LIBRARIES (fixture name -> kernel families; the fixture is parametrized by
the architecture): tests/conftest.py reads it to build the libraries ahead, in parallel, or to skip their tests in
the default run while the libraries are not built."""

import ctypes
import os

import pytest

from tests.amd_emulation import build

# CI sets ROCM_SD_REQUIRE_BUILD_TOOLS: a missing clang++ then fails the tests instead of skipping them.
MARKS = [pytest.mark.amd_emulation,
         pytest.mark.skipif(build.compiler() is None and not os.environ.get("ROCM_SD_REQUIRE_BUILD_TOOLS"),
                            reason="the AMD emulation needs clang++")]

ARCHS = ["gfx942", "gfx1100", "gfx1201"]  # the kernels' architectures (build.ARCHS adds gfx950 for the FP8 attention only)


def library(arch: str, sources: list[str], **entry_points) -> ctypes.CDLL:
    """The emulated kernels of hip/<source>.hip for `arch` (built once per source state, cached), with the
    argument types of each entry point named; every entry point returns "" or the error."""
    lib = ctypes.CDLL(str(build.build(arch, sources)))
    for name, argtypes in entry_points.items():
        function = getattr(lib, name)
        function.restype = ctypes.c_char_p
        function.argtypes = argtypes
    return lib


def pointer(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def run(function, *args) -> None:
    """Calls an entry point that launches kernels; the launcher's or the emulation's error fails the test."""
    error = function(*args).decode()
    assert error == "", error
