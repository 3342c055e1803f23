"""The kernels that quantize their own output (ops/quantized_outputs.py) under the emulation: their y is the plain
kernel's y bit for bit, and (q, scale) is the definition's quantization of that y bit for bit (with a bound: one scale
for every row, values beyond it saturated), on wave32 and wave64; without y the same (q, scale) (the GEGLU's: within
a code, from its GELU for 8-bit rows)."""

import ctypes

import pytest
import torch

from rocm_sd.ops.quantize import FORMATS, quantize_rows_ref
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_quantize_rows import rows_within_a_code, same_codes

pytestmark = MARKS
LIBRARIES = {"emulated": ["layer_norm", "geglu"]}

DTYPES = {torch.float16: 1, torch.bfloat16: 2}
LAYER_NORM_ARGS = [ctypes.c_void_p] * 6 + [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_float]


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    return request.param, library(
        request.param, LIBRARIES["emulated"], rsd_emu_layer_norm=LAYER_NORM_ARGS,
        rsd_emu_layer_norm_quantize_rows=LAYER_NORM_ARGS + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                                            ctypes.c_float],
        rsd_emu_geglu=[ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_int64, ctypes.c_int64],
        rsd_emu_geglu_quantize_rows=[ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                                              ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                                              ctypes.c_float])


def _poisoned(shape, fmt):
    return torch.full(shape, 0x55, dtype=torch.uint8), torch.full(shape[:-1], float("nan"))


# Every format per row; the fp8 ones also with a bound below some values (the elementwise GEGLU kernel, LayerNorm's
# rows without their reduction)
FORMAT_BOUNDS = [(fmt, 0.0) for fmt in FORMATS] + [(fmt, 2.5) for fmt in FORMATS if fmt != "int8"]


def _check(arch, y, q, scale, y_plain, fmt, bound):
    assert torch.equal(y.nan_to_num(7.0), y_plain.nan_to_num(7.0)), f"{arch} {fmt}: y differs from the plain kernel's"
    q_ref, scale_ref = quantize_rows_ref(y, fmt, bound)
    assert torch.equal(scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0)), f"{arch} {fmt}: row scales differ"
    assert same_codes(q, q_ref), f"{arch} {fmt}: codes differ"


# SD's widths (one to several 8-wide vectors a lane), a row of one vector, and a wide row with NaN.
@pytest.mark.parametrize("fmt, bound", FORMAT_BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize("residual", [False, True], ids=["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("shape", [(5, 320), (9, 1280), (3, 8), (4, 2048)], ids=str)
def test_layer_norm_quantize_rows(emulated, shape, residual, dtype, fmt, bound):
    arch, lib = emulated
    rows, c = shape
    x = (torch.randn(shape) * 3 + 0.5).to(dtype)
    if rows > 3:
        x[3, 5] = float("nan")
    w, b = (torch.rand(c) + 0.5).to(dtype), torch.randn(c).to(dtype)
    r = torch.randn(shape).to(dtype) if residual else None
    outputs = []
    for quantize in (False, True):
        y = torch.full_like(x, float("nan"))
        total = torch.full_like(x, float("nan")) if residual else None
        args = (pointer(x), pointer(r), pointer(total), pointer(y), pointer(w), pointer(b), DTYPES[dtype],
                DTYPES[dtype], rows, c, 1e-5)
        if quantize:
            q, scale = _poisoned(shape, fmt)
            run(lib.rsd_emu_layer_norm_quantize_rows, *args, pointer(q), pointer(scale), FORMATS[fmt][0], bound)
            outputs.append((y, q, scale, total))
        else:
            run(lib.rsd_emu_layer_norm, *args)
            outputs.append((y, total))
    (y_plain, total_plain), (y, q, scale, total) = outputs
    _check(arch, y, q, scale, y_plain, fmt, bound)
    if residual:
        assert torch.equal(total.nan_to_num(7.0), total_plain.nan_to_num(7.0))
    # Without y (rocm_sd::layer_norm_quantized / add_layer_norm_quantized): the same rows and sum
    q_alone, scale_alone = _poisoned(shape, fmt)
    total_alone = torch.full_like(x, float("nan")) if residual else None
    run(lib.rsd_emu_layer_norm_quantize_rows, pointer(x), pointer(r), pointer(total_alone), None, pointer(w),
        pointer(b), DTYPES[dtype], DTYPES[dtype], rows, c, 1e-5, pointer(q_alone), pointer(scale_alone),
        FORMATS[fmt][0], bound)
    assert torch.equal(scale_alone.nan_to_num(-1.0), scale.nan_to_num(-1.0)) and same_codes(q_alone, q), arch
    if residual:
        assert torch.equal(total_alone.nan_to_num(7.0), total_plain.nan_to_num(7.0))


@pytest.mark.parametrize("fmt, bound", FORMAT_BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
# A block per row up to 1024 vectors (5120 fp16 features: 640), a wave per row beyond (1031 odd features: 1031)
@pytest.mark.parametrize("shape", [(3, 2 * 640), (2, 2 * 5120), (5, 2 * 7), (1, 2), (2, 2 * 1031)], ids=str)
def test_geglu_quantize_rows(emulated, shape, dtype, fmt, bound):
    arch, lib = emulated
    x = (torch.randn(shape) * 2).to(dtype)
    rows, d = shape[0], shape[1] // 2
    y_plain, y = (torch.full((rows, d), float("nan"), dtype=dtype) for _ in range(2))
    run(lib.rsd_emu_geglu, pointer(x), pointer(y_plain), DTYPES[dtype], rows, d)
    q, scale = _poisoned((rows, d), fmt)
    run(lib.rsd_emu_geglu_quantize_rows, pointer(x), pointer(y), DTYPES[dtype], rows, d, pointer(q), pointer(scale),
        FORMATS[fmt][0], bound)
    _check(arch, y, q, scale, y_plain, fmt, bound)
    # Without y (rocm_sd::geglu_quantized): the same rows from the row block, which every shape here takes (with a
    # bound: the elementwise kernel, not writing y), up to the rounding of its GELU for 8-bit rows.
    q_alone, scale_alone = _poisoned((rows, d), fmt)
    run(lib.rsd_emu_geglu_quantize_rows, pointer(x), None, DTYPES[dtype], rows, d, pointer(q_alone),
        pointer(scale_alone), FORMATS[fmt][0], bound)
    problem = rows_within_a_code(q_alone, scale_alone, q, scale, fmt)
    assert not problem, (arch, problem)
