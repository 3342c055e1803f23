"""What a command that runs nothing pulls in: `python -m rocm_sd --help`, `python -m rocm_sd.tune --help` and an
argument error must import neither torch nor diffusers (a command imports them when it runs), while `import rocm_sd`
still registers torch.ops.rocm_sd.* with torch, whichever of the two is imported first. Checked on sys.modules in a
fresh process, not by a timing."""
import subprocess
import sys

import pytest

# Runs one entry point as `python -m` would (the package's __init__ first), then prints the heavy modules it imported.
PROBE = """
import contextlib, io, runpy, sys
module, sys.argv = sys.argv[1], [sys.argv[1]] + sys.argv[2:]
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
print(sorted({"torch", "diffusers"} & set(sys.modules)))
"""


@pytest.mark.parametrize("command", [
    ["rocm_sd", "--help"],
    ["rocm_sd", "bench", "--help"],
    ["rocm_sd", "bench", "--steps", "-3"],
    ["rocm_sd", "bench", "--ablation", "no_such_flag"],
    ["rocm_sd", "generate", "--help"],
    ["rocm_sd", "quality", "--precision", "fp4"],
    ["rocm_sd.tune", "--help"],
    ["rocm_sd.tune", "--ops", "no_such_op"],
], ids=" ".join)
def test_help_and_argument_errors_import_no_torch(command):
    probe = subprocess.run([sys.executable, "-c", PROBE, *command], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.strip() == "[]", f"python -m {' '.join(command)} imported {probe.stdout.strip()}"


def test_import_rocm_sd_is_light_and_registers_the_ops_when_torch_comes():
    """`import rocm_sd` imports no torch; the ops and the tuned-choice lookup register when torch's import completes,
    and torch keeps its own loader; a lookup of torch before its import (diffusers' is_torch_available) does not use
    the hook up, and the hook leaves sys.meta_path once torch is in. (Torch first, then rocm_sd: what every other test
    does.)"""
    script = ("import importlib.util, sys\nimport rocm_sd\nlight = 'torch' not in sys.modules\n"
              "importlib.util.find_spec('torch')\nimport torch\n"
              "own_loader = type(torch.__loader__).__module__ != 'rocm_sd._torch_hook'\n"
              "gone = not any(type(f).__module__ == 'rocm_sd._torch_hook' for f in sys.meta_path)\n"
              "print(light, torch.ops.rocm_sd.group_norm.default.name(), 'rocm_sd.tune.active' in sys.modules, "
              "own_loader and gone, rocm_sd.optimize.__module__, rocm_sd.stats.__module__)")
    probe = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.split() == ["True", "rocm_sd::group_norm", "True", "True", "rocm_sd.patch.pipeline",
                                    "rocm_sd.dispatch"]


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
