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

from rocm_sd.jit import attention_plan
from rocm_sd.ops._common import within_tolerance
from rocm_sd.ops.attention import attention_ref
from rocm_sd.ops.layer_norm import add_layer_norm_ref, layer_norm_ref
from tests.amd_emulation import build
from tests.ops.test_attention import make_qkv

# CI sets ROCM_SD_REQUIRE_BUILD_TOOLS: a missing clang++ then fails the tests instead of skipping them.
pytestmark = [pytest.mark.amd_emulation,
              pytest.mark.skipif(build.compiler() is None and not os.environ.get("ROCM_SD_REQUIRE_BUILD_TOOLS"),
                                 reason="the AMD emulation needs clang++")]

# The kernels' architectures (build.ARCHS also has gfx950, emulated for the FP8 kernels' OCP MFMA only: these tests
# would run the same CDNA code paths as gfx942's again).
ARCHS = ["gfx942", "gfx1100", "gfx1201"]
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# Each fixture's kernel families (tests/conftest.py builds the libraries ahead, or skips their tests while cold).
# layer_norm comes with geglu: the library tests/amd_emulation_tests/test_quantized_outputs.py loads too, one build.
LIBRARIES = {"emulated": ["layer_norm", "geglu"], "emulated_attention": ["attention", "attention_wide"],
             "emulated_attention_fp8": ["attention_fp8"]}


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
        assert set(matrices) == {"A", "B", "D"}, key
        for matrix, entries in matrices.items():
            theirs = {(r, c): place for r, row in enumerate(calculator[key][matrix]) for c, place in enumerate(row)}
            assert set(entries) == set(theirs), f"{key} {matrix}: not the calculator's shape"  # 16 x K, K x 16, 16 x 16
            wrong = {rc: (ours_at, theirs[rc]) for rc, ours_at in entries.items() if ours_at != theirs[rc]}
            assert not wrong, f"{key} {matrix}: (ours, calculator's) {dict(list(wrong.items())[:4])}"


FP8 = {"e4m3fnuz": torch.float8_e4m3fnuz, "e4m3fn": torch.float8_e4m3fn}


def test_fp8_codes_are_torchs(matrix_layout_test):
    """Every FP8 code's value as the emulated fp8 MFMA / WMMA read it (rsd_emu/amdgcn_matrix.h fp8_to_double), in
    both formats, against torch's float8_e4m3fnuz / float8_e4m3fn: NaN codes as NaN, every other value exactly."""
    printed = subprocess.run([str(matrix_layout_test), "--fp8-decode"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    ours = {}
    for line in printed:
        name, code, value = line.split("|")
        ours[name, int(code)] = math.nan if value == "nan" else float.fromhex(value)
    assert len(ours) == 512
    for name, dtype in FP8.items():
        torchs = torch.arange(256, dtype=torch.uint8).view(dtype).float().tolist()
        for code, want in enumerate(torchs):
            got = ours[name, code]
            assert (math.isnan(got) and math.isnan(want)) or got == want, f"{name} {code:#04x}: {got} (torch {want})"


# v_cvt_pk_fp8_f32 where the emulation converts (rsd_emu/amdgcn_matrix.h fp8_from_float: round to nearest even,
# nothing beyond [-max, max]) and torch rounds the same way. For each format: exact values, ties (to the even code),
# the max and what rounds to it, subnormals and their ties, zero and what rounds to it (torch also keeps e4m3fn's -0),
# and values between the codes.
CVT_VALUES = {
    "e4m3fnuz": [0.0, 1.0, -1.0, 1.0625, 1.1875, 1.0625 + 2**-20, 240.0, -240.0, 247.9, 232.0, 2**-7, 2**-10,
                 3 * 2**-11, 2**-11, 2**-11 + 2**-30, 5 * 2**-11, 2**-8 * 1.0625, 1e-30, -1e-30, 2**-140, 0.3,
                 -17.3, 100.0],
    "e4m3fn": [0.0, -0.0, 1.0, -1.0, 1.0625, 1.1875, 448.0, -448.0, 464.0, 440.0, 2**-6, 2**-9, 3 * 2**-10,
               2**-10, 5 * 2**-10, 2**-10 - 2**-30, 2**-7 * 1.0625, 1e-30, -1e-30, 2**-140, 0.3, -17.3, 100.0],
}


def test_cvt_pk_fp8_f32_rounds_as_torch(matrix_layout_test):
    """The emulated v_cvt_pk_fp8_f32 against torch's float32 -> float8 conversion (round to nearest even): src0's
    code in the low byte and src1's in the high byte of the half word_sel picks, the other half of `old` kept."""
    cases = []
    for name, values in CVT_VALUES.items():
        codes = torch.tensor(values, dtype=torch.float32).to(FP8[name]).view(torch.uint8).tolist()
        for i, (value, code) in enumerate(zip(values, codes)):
            partner = len(values) - 1 - i  # src1: another value of the list
            old = 0x9AB4C3D2 ^ (i * 0x01010101)
            for word_sel in (0, 1):
                pair = code | (codes[partner] << 8)
                want = (old & 0x0000FFFF) | (pair << 16) if word_sel else (old & 0xFFFF0000) | pair
                cases.append((f"{name} {old} {word_sel} {float(value).hex()} {float(values[partner]).hex()}", want))
    run = subprocess.run([str(matrix_layout_test), "--cvt-pk"], input="\n".join(c for c, _ in cases) + "\n",
                         capture_output=True, text=True, check=True)
    got = run.stdout.splitlines()
    assert len(got) == len(cases), run.stdout + run.stderr
    wrong = [(case, out, f"{want}") for (case, want), out in zip(cases, got) if out != f"{want}"]
    assert not wrong, wrong[:4]


# Where no document found says what the instruction does (rsd_emu/amdgcn_matrix.h fp8_from_float): beyond max (torch:
# e4m3fn saturates, e4m3fnuz gives NaN), infinities, and which NaN code e4m3fn gets. The emulation refuses them.
CVT_UNDOCUMENTED = ["e4m3fnuz 0x1.fp+7", "e4m3fnuz 1e10", "e4m3fnuz inf", "e4m3fn 0x1.d1p+8", "e4m3fn -480",
                    "e4m3fn -inf", "e4m3fn nan"]


def test_cvt_pk_fp8_f32_refuses_what_is_not_documented(matrix_layout_test):
    lines = [f"{case.split()[0]} 0 0 {case.split()[1]} 0" for case in CVT_UNDOCUMENTED]
    lines += [f"{case.split()[0]} 0 1 0 {case.split()[1]}" for case in CVT_UNDOCUMENTED]  # as src1, word 1
    run = subprocess.run([str(matrix_layout_test), "--cvt-pk"], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True)
    got = run.stdout.splitlines()
    assert len(got) == len(lines) and all(out.startswith("refused: ") for out in got), list(zip(lines, got))


def test_launch_rewrite_finds_every_kernel_expression():
    text = ("case 1: k<T, 4><<<blocks, kThreads, 0, stream>>>(x, y); break;\n"
            "kernel_of<T, P, decltype(tag)::value>()<<<b, t, 0, s>>>(\n  a);\n"
            "apply\n    <<<dim3(unsigned(p.splits), 2u), p.threads, 0, stream>>>(q);")
    assert build.rewrite_launches(text) == (
        "case 1: ::rsd_emu::launch(k<T, 4>, blocks, kThreads, 0, stream)(x, y); break;\n"
        "::rsd_emu::launch(kernel_of<T, P, decltype(tag)::value>(), b, t, 0, s)(\n  a);\n"
        "::rsd_emu::launch(apply, dim3(unsigned(p.splits), 2u), p.threads, 0, stream)(q);")


def test_shared_rewrite_poisons_every_declaration():
    text = ("  // __shared__ in a comment stays\n"
            "  __shared__ __align__(16) uint16_t storage[2 * kTile];\n"
            "  __shared__ float tile[64][kMaxHeadDim + 1];\n"
            "  __shared__ unsigned ticket_shared;  // one; __shared__ in a comment stays\n")
    assert build.rewrite_shared(text) == (
        "  // __shared__ in a comment stays\n"
        "  thread_local __align__(16) uint16_t storage[2 * kTile]; "
        "::rsd_emu::declare_shared(&storage, sizeof(storage));\n"
        "  thread_local float tile[64][kMaxHeadDim + 1]; ::rsd_emu::declare_shared(&tile, sizeof(tile));\n"
        "  thread_local unsigned ticket_shared; ::rsd_emu::declare_shared(&ticket_shared, sizeof(ticket_shared));"
        "  // one; __shared__ in a comment stays\n")


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    """(arch, the emulated layer_norm library) for one architecture; built once per source state (cached)."""
    library = ctypes.CDLL(str(build.build(request.param, LIBRARIES["emulated"])))
    library.rsd_emu_layer_norm.restype = ctypes.c_char_p
    library.rsd_emu_layer_norm.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                                                   ctypes.c_int64, ctypes.c_float]
    return request.param, library


@pytest.fixture(scope="module", params=ARCHS)
def emulated_attention(request):
    """(arch, the emulated attention library: narrow and wide families)."""
    library = ctypes.CDLL(str(build.build(request.param, LIBRARIES["emulated_attention"])))
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


# The instances of less shared memory (hip/attention/attention.hip's "_kv" ones: one K / V stage, or K and V taking
# turns in one tile), by name: a head dim 8 below the padded one, three key tiles (the last partial) and two blocks
# (the second partial), so that the tile a stage or K and V share is refilled while other waves may still read it.
KV_INSTANCES = [inst for inst in attention_plan.INSTANCES if inst.kv_tiles]


@pytest.mark.parametrize("instance", KV_INSTANCES, ids=lambda inst: inst.name)
def test_attention_kv_instances(emulated_attention, instance):
    arch, library = emulated_attention
    dtype = {1: torch.float16, 2: torch.bfloat16}[instance.dtype]
    case = (1, instance.block_m + 5, 2 * instance.block_n + 13, 1, instance.padded_dim - 8, instance.name)
    error, out, truth, same = run_attention(library, case, dtype)
    assert error == "", error
    ok, err, allowed = within_tolerance(out, truth, same)
    assert ok, f"{arch} {case} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"


def test_attention_refuses_the_spilling_wide_instance_on_rdna3(emulated_attention):
    """Two query tiles a wave of the wide family spill on RDNA3 (hip/attention/attention.hip spills_on): asked for by name
    it is refused there, and the heuristic's pick for the same call (the (1, 1, 1, 1, 512) case above) runs; elsewhere
    (CDNA, RDNA4) it runs."""
    arch, library = emulated_attention
    error, out, truth, same = run_attention(library, (1, 20, 20, 1, 512, "f16_d512_w4_r2_n16_wide"), torch.float16)
    if arch == "gfx1100":
        assert "spills registers to scratch" in error, error
    else:
        assert error == "", error
        ok, err, allowed = within_tolerance(out, truth, same)
        assert ok, f"{arch}: max err {err:.3g} > allowed {allowed:.3g}"


# ---- FP8 attention (hip/attention_fp8/): the MFMA fp8 layouts of gfx942 (e4m3fnuz) and gfx950 (OCP e4m3fn), the
# gfx12 WMMA fp8 layout, and v_cvt_pk_fp8_f32, lane by lane. gfx1100 has no FP8 and must refuse.
FP8_ARCHS = {"gfx942": "e4m3fnuz", "gfx950": "e4m3fn", "gfx1201": "e4m3fn", "gfx1100": None}
# (batch, q_len, kv_len, heads, head_dim): partial query and key tiles, SD1.5's padded 40, SDXL's 64, 160, and a
# long self-attention that takes two query tiles a wave.
FP8_ATTENTION_SHAPES = [(1, 130, 97, 2, 40), (2, 33, 77, 1, 64), (1, 20, 20, 1, 160), (1, 2048, 64, 1, 64)]


@pytest.fixture(scope="module", params=list(FP8_ARCHS))
def emulated_attention_fp8(request):
    library = ctypes.CDLL(str(build.build(request.param, LIBRARIES["emulated_attention_fp8"])))
    library.rsd_emu_attention_fp8.restype = ctypes.c_char_p
    library.rsd_emu_attention_fp8.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] + [ctypes.c_int64] * 5 + [
        ctypes.POINTER(ctypes.c_int64), ctypes.c_float, ctypes.c_int]
    return request.param, library


@pytest.mark.parametrize("shape", FP8_ATTENTION_SHAPES, ids=str)
def test_attention_fp8(emulated_attention_fp8, shape):
    """As accurate as the FP8 definition (ops/attention_fp8.attention_fp8_ref) against exact attention: what the GPU
    test holds the NVIDIA kernel to (tests/ops/test_attention_fp8.py)."""
    from rocm_sd.ops.attention import attention_ref
    from rocm_sd.ops.attention_fp8 import attention_fp8_ref
    from rocm_sd.ops.quantize import FORMATS

    arch, library = emulated_attention_fp8
    batch, q_len, kv_len, heads, dim = shape
    q, k, v = make_qkv(batch, q_len, kv_len, heads, dim, torch.float16, "cpu")
    out = torch.full_like(q, float("nan"))
    strides = (ctypes.c_int64 * 12)(*[s for t in (q, k, v, out) for s in t.stride()[:3]])
    fmt = FP8_ARCHS[arch] or "e4m3fn"
    error = library.rsd_emu_attention_fp8(_ptr(q), _ptr(k), _ptr(v), _ptr(out), DTYPES[torch.float16], batch, heads,
                                          q_len, kv_len, dim, strides, dim ** -0.5, FORMATS[fmt][0])
    if FP8_ARCHS[arch] is None:
        assert b"no FP8 matrix instructions on gfx1100" in error, error
        return
    assert error == b"", error.decode()
    exact = attention_ref(q.double(), k.double(), v.double(), dim ** -0.5)
    definition = attention_fp8_ref(q.double(), k.double(), v.double(), dim ** -0.5, fmt)
    rms = lambda x: x.double().pow(2).mean().sqrt().item()  # noqa: E731
    rounding = 2 ** -8 * exact.abs().max().item()
    assert not torch.isnan(out).any()
    assert rms(out - exact) <= 1.25 * rms(definition - exact) + rounding / 4, (arch, rms(out - exact), rms(definition - exact))
    assert (out - exact).abs().max() <= 1.5 * (definition - exact).abs().max() + rounding
