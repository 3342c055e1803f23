"""The default run (`python -m pytest`, no slow lane) compiles no emulated library: with a cold cache it skips the
tests of the libraries not built yet, saying how to build them, and leaves the cache empty (tests/conftest.py)."""

import os
import subprocess
import sys

from tests.amd_emulation_tests.emulated import MARKS

pytestmark = MARKS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_default_run_skips_cold_libraries_without_compiling(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ROCM_SD_RUN_SLOW", "PYTEST_ADDOPTS")}
    env["ROCM_SD_EMU_CACHE"] = str(tmp_path / "cache")
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/amd_emulation_tests/test_geglu.py", "-q", "-rs",
                          "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" not in run.stdout and "skipped" in run.stdout, run.stdout[-3000:]
    assert "gfx942 geglu library is not built yet" in run.stdout, run.stdout[-3000:]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
