"""What a command that runs nothing pulls in: `python -m rocm_sd --help`, `python -m rocm_sd.tune --help` and an
argument error must not import torch._dynamo (it doubles the time and memory of the import; only torch.compile
needs it). Checked on sys.modules in a fresh process, not by a timing."""
import subprocess
import sys

import pytest

# Runs one entry point as `python -m` would, then prints whether torch._dynamo was imported.
PROBE = """
import contextlib, io, runpy, sys
module, sys.argv = sys.argv[1], [sys.argv[1]] + sys.argv[2:]
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
print("torch._dynamo" in sys.modules)
"""


@pytest.mark.parametrize("command", [
    ["rocm_sd", "--help"],
    ["rocm_sd", "bench", "--steps", "-3"],
    ["rocm_sd.tune", "--help"],
    ["rocm_sd.tune", "--batch", "0"],
], ids=" ".join)
def test_help_and_argument_errors_do_not_import_dynamo(command):
    probe = subprocess.run([sys.executable, "-c", PROBE, *command], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.strip() == "False", f"python -m {' '.join(command)} imported torch._dynamo"


def test_the_ops_mark_what_torch_compile_takes_as_constant_as_torch_does():
    """ops/_common.constant_under_compile sets torch.compiler.assume_constant_result's mark without importing
    torch._dynamo: the same attributes on the function, or a torch upgrade has changed the mark."""
    import torch

    from rocm_sd.ops._common import constant_under_compile

    def ours():
        return True

    def torchs():
        return True

    constant_under_compile(ours)
    torch.compiler.assume_constant_result(torchs)
    assert vars(ours) == vars(torchs) and vars(ours)
