"""The AMD code paths executed on the CPU (tests/amd_emulation): the matrix-core instructions' documented lane
layouts, then rocm_sd's kernels compiled as host C++ for an emulated gfx942 (CDNA3: wave64, MFMA), gfx1100
(RDNA3: wave32, WMMA) and gfx1201 (RDNA4: wave32, its own WMMA layout), checked against float64 references with
the GPU tests' tolerances.

What this proves and what it cannot: tests/amd_emulation/include/rsd_emu/lanes.h (execution model) and docs/amd.md.
No AMD GPU is involved."""

import ctypes
import json
import math
import os
import subprocess

import pytest
import torch

from rocm_sd.ops._common import within_tolerance
from rocm_sd.ops.attention import attention_ref
from rocm_sd.ops.layer_norm import add_layer_norm_ref, layer_norm_ref
from tests.amd_emulation import build
from tests.ops.test_attention import make_qkv

# CI sets ROCM_SD_REQUIRE_BUILD_TOOLS: a missing clang++ then fails the tests instead of skipping them.
pytestmark = [pytest.mark.amd_emulation,
              pytest.mark.skipif(build.compiler() is None and not os.environ.get("ROCM_SD_REQUIRE_BUILD_TOOLS"),
                                 reason="the AMD emulation needs clang++")]

ARCHS = list(build.ARCHS)
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@pytest.fixture(scope="module")
def matrix_layout_test(tmp_path_factory):
    exe = tmp_path_factory.mktemp("matrix") / "matrix_layout_test"
    subprocess.run([build.compiler(), "-std=c++17", "-O1", f"-I{build.INCLUDE}",
                    str(build.HERE / "matrix_layout_test.cpp"), "-o", str(exe)], check=True)
    return exe


def test_matrix_instructions_follow_the_documented_layouts(matrix_layout_test):
    run = subprocess.run([str(matrix_layout_test)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stdout + run.stderr


def test_layout_tables_are_the_matrix_instruction_calculators(matrix_layout_test):
    """Every entry of the emulation's layout tables against AMD's calculator (matrix_layouts.json), for every
    instruction the kernels call: a table mistyped in the emulation cannot agree with itself here."""
    calculator = json.loads((build.HERE / "matrix_layouts.json").read_text())
    printed = subprocess.run([str(matrix_layout_test), "--tables"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    ours = {}
    for line in printed:
        key, matrix, row, col, places = line.split("|")
        ours.setdefault(key, {}).setdefault(matrix, {})[int(row), int(col)] = places
    assert set(ours) == {key for key in calculator if not key.startswith("_")}
    for key, matrices in ours.items():
        for matrix, entries in matrices.items():
            theirs = {(r, c): place for r, row in enumerate(calculator[key][matrix]) for c, place in enumerate(row)}
            wrong = {rc: (ours_at, theirs[rc]) for rc, ours_at in entries.items() if ours_at != theirs[rc]}
            assert len(entries) == 256 and not wrong, f"{key} {matrix}: (ours, calculator's) {dict(list(wrong.items())[:4])}"


def test_launch_rewrite_finds_every_kernel_expression():
    text = ("case 1: k<T, 4><<<blocks, kThreads, 0, stream>>>(x, y); break;\n"
            "kernel_of<T, P, decltype(tag)::value>()<<<b, t, 0, s>>>(\n  a);\n"
            "apply\n    <<<dim3(unsigned(p.splits), 2u), p.threads, 0, stream>>>(q);")
    assert build.rewrite_launches(text) == (
        "case 1: ::rsd_emu::launch(k<T, 4>, blocks, kThreads, 0, stream)(x, y); break;\n"
        "::rsd_emu::launch(kernel_of<T, P, decltype(tag)::value>(), b, t, 0, s)(\n  a);\n"
        "::rsd_emu::launch(apply, dim3(unsigned(p.splits), 2u), p.threads, 0, stream)(q);")


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    """(arch, the emulated layer_norm library) for one architecture; built once per source state (cached)."""
    library = ctypes.CDLL(str(build.build(request.param, ["layer_norm"])))
    library.rsd_emu_layer_norm.restype = ctypes.c_char_p
    library.rsd_emu_layer_norm.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                                                   ctypes.c_int64, ctypes.c_float]
    return request.param, library


@pytest.fixture(scope="module", params=ARCHS)
def emulated_attention(request):
    """(arch, the emulated attention library: narrow and wide families)."""
    library = ctypes.CDLL(str(build.build(request.param, ["attention", "attention_wide"])))
    library.rsd_emu_attention.restype = ctypes.c_char_p
    library.rsd_emu_attention.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] + [ctypes.c_int64] * 5 + [
        ctypes.POINTER(ctypes.c_int64), ctypes.c_float, ctypes.c_char_p]
    return request.param, library


def _ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


# Rows x channels: SD widths (vector loads of 8 halves, several vectors a lane on wave32), odd channel counts
# (scalar loads, lanes without a vector), a row shorter than a wave, and rows that leave the last wave of the
# last block idle.
LAYER_NORM_SHAPES = [(5, 320), (3, 77), (9, 1280), (2, 24), (37, 40)]


@pytest.mark.parametrize("residual", [False, True], ids=["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize("shape", LAYER_NORM_SHAPES, ids=str)
def test_layer_norm(emulated, shape, dtype, residual):
    arch, library = emulated
    rows, c = shape
    x = (torch.randn(shape) * 2 + 0.5).to(dtype)
    w, b = (torch.rand(c) + 0.5).to(dtype), torch.randn(c).to(dtype)
    r = torch.randn(shape).to(dtype) if residual else None
    y = torch.full_like(x, float("nan"))
    total = torch.full_like(x, float("nan")) if residual else None
    error = library.rsd_emu_layer_norm(_ptr(x), _ptr(r), _ptr(total), _ptr(y), _ptr(w), _ptr(b), DTYPES[dtype],
                                       DTYPES[dtype], rows, c, 1e-5)
    assert error == b"", error.decode()
    if residual:
        truth = add_layer_norm_ref(x.double(), r.double(), w.double(), b.double(), 1e-5)
        same = add_layer_norm_ref(x, r, w, b, 1e-5)
        # The kernel normalises the stored (rounded) sum, as torch does: judge y against the truth of that sum.
        truth = (truth[0], layer_norm_ref(same[0].double(), w.double(), b.double(), 1e-5))
        ok, err, allowed = within_tolerance((total, y), truth, same)
    else:
        ok, err, allowed = within_tolerance(y, layer_norm_ref(x.double(), w.double(), b.double(), 1e-5),
                                            layer_norm_ref(x, w, b, 1e-5))
    assert ok, f"{arch} {shape} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"


# (batch, q_len, kv_len, heads, head_dim, instance or "" for the heuristic): 77 text keys, odd query counts that
# leave waves of the last block without rows, head dims 40 / 64 / 80 / 160 (padded 48 / 64 / 80 / 160), two query
# tiles a wave, and the wide family (168, 504, 512) whose waves split the head dim.
ATTENTION_CASES = [(3, 77, 77, 2, 40, ""), (1, 33, 17, 2, 8, ""), (2, 20, 77, 1, 64, "f16_d64_w4_r2_n32"),
                   (1, 70, 45, 1, 80, ""), (1, 16, 1, 1, 160, ""), (1, 40, 90, 1, 168, ""), (3, 17, 33, 1, 504, ""),
                   (1, 1, 1, 1, 512, "")]


def run_attention(library, case, dtype):
    """Runs one ATTENTION_CASES-style case on the emulated library: (the kernel's error, out, float64 truth,
    same-precision reference). The output starts as NaN: every element must be written."""
    batch, q_len, kv_len, heads, dim, instance = case
    q, k, v = make_qkv(batch, q_len, kv_len, heads, dim, dtype, "cpu")
    scale = 1.0 / math.sqrt(dim)
    out = torch.full(q.shape, float("nan"), dtype=dtype)
    strides = (ctypes.c_int64 * 12)(*[s for t in (q, k, v, out) for s in t.stride()[:3]])
    error = library.rsd_emu_attention(_ptr(q), _ptr(k), _ptr(v), _ptr(out), DTYPES[dtype], batch, heads, q_len, kv_len,
                                      dim, strides, scale, instance.encode()).decode()
    return error, out, attention_ref(q.double(), k.double(), v.double(), scale), attention_ref(q, k, v, scale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=str)
def test_attention(emulated_attention, case, dtype):
    arch, library = emulated_attention
    if case[-1] and dtype == torch.bfloat16:
        case = (*case[:-1], case[-1].replace("f16_", "bf16_", 1))
    error, out, truth, same = run_attention(library, case, dtype)
    assert error == "", error
    ok, err, allowed = within_tolerance(out, truth, same)
    assert ok, f"{arch} {case} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"


def test_attention_refuses_the_spilling_wide_instance_on_rdna(emulated_attention):
    """Two query tiles a wave of the wide family spill on RDNA (hip/attention/attention.hip spills_on): asked for by name it
    is refused there, and the heuristic's pick for the same call (the (1, 1, 1, 1, 512) case above) runs."""
    arch, library = emulated_attention
    error, out, truth, same = run_attention(library, (1, 20, 20, 1, 512, "f16_d512_w4_r2_n16_wide"), torch.float16)
    if build.ARCHS[arch]["wave"] == 32:
        assert "spills registers to scratch" in error, error
    else:
        assert error == "", error
        ok, err, allowed = within_tolerance(out, truth, same)
        assert ok, f"{arch}: max err {err:.3g} > allowed {allowed:.3g}"
