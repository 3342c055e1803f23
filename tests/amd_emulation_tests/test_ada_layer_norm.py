"""ada_layer_norm and add_ada_layer_norm (hip/ada_layer_norm/ada_layer_norm.hip) under the emulation: one wave a row
and row groups of several waves (block barriers), 16-byte and scalar accesses, parameters as chunks of an embedding
and transposed; their quantized outputs (ops/ada_layer_norm_quantized.py) bit for bit the definition's quantization
of the plain kernel's output, with the row group's maximum joined across its waves."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES, within_tolerance
from rocm_sd.ops.ada_layer_norm import ada_layer_norm_ref
from rocm_sd.ops.quantize import FORMATS, quantize_rows_ref
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_ada_layer_norm import make, truth
from tests.ops.test_quantize_rows import same_codes

pytestmark = MARKS
LIBRARIES = {"emulated": ["ada_layer_norm"]}  # built before the first test, with the others (tests/conftest.py)

STRIDES = ctypes.c_int64 * 2


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    shape_args = [ctypes.c_int] + [ctypes.c_int64] * 3 + [ctypes.POINTER(ctypes.c_int64)] * 3 + [ctypes.c_float]
    return request.param, library(request.param, LIBRARIES["emulated"],
                                  rsd_emu_ada_layer_norm=[ctypes.c_void_p] * 7 + shape_args,
                                  rsd_emu_ada_layer_norm_quantized=[ctypes.c_void_p] * 6 + shape_args + [
                                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_float])


# Scalar tail, 77 tokens, batch 3 (one wave a row, several rows a block); 16-byte vectors, one wave a row; SD3.5
# Large's 2432 channels (row groups of 5 waves of 32 / 3 of 64, lanes with one vector and with two); 4096 scalar
# channels (transposed parameters: 512 threads, 8 vectors a lane).
SHAPES = [(3, 5, 33), (2, 3, 320), (2, 2, 2432)]


def _strides(t):
    return STRIDES(*t.stride())


def _emulate(lib, x, scale, shift, y=None, gate=None):
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    h = None if y is None else torch.full_like(x, float("nan"))
    b, tokens, c = x.shape
    run(lib.rsd_emu_ada_layer_norm, pointer(x), pointer(y), pointer(gate), pointer(scale), pointer(shift),
        pointer(h), pointer(out), DTYPE_CODES[x.dtype], b, tokens, c, _strides(gate if gate is not None else scale),
        _strides(scale), _strides(shift), 1e-6)
    return h, out


@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("gated", [False, True], ids=["ada_layer_norm", "add_ada_layer_norm"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_ada_layer_norm(emulated, shape, gated, dtype):
    arch, lib = emulated
    x, shift, scale, gate = make(shape, dtype, "cpu")
    y = torch.randn_like(x) if gated else None
    h, out = _emulate(lib, x, scale, shift, y, gate if gated else None)
    if gated:
        ok, err, allowed = within_tolerance(h, x.double() + gate.double()[:, None] * y.double(),
                                            x + gate[:, None] * y)
        assert ok, f"{arch} {shape} {dtype} h: max err {err:.3g} > allowed {allowed:.3g}"
        x = h  # the norm is of the rounded h
    ok, err, allowed = within_tolerance(out, truth(x, scale, shift, 1e-6), ada_layer_norm_ref(x, scale, shift, 1e-6))
    assert ok, f"{arch} {shape} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"


def test_transposed_parameters_take_the_scalar_path(emulated):
    arch, lib = emulated
    x = torch.randn(2, 3, 4096, dtype=torch.bfloat16)
    scale, shift, gate = (torch.randn(4096, 2, dtype=torch.bfloat16).t() for _ in range(3))
    y = torch.randn_like(x)
    h, out = _emulate(lib, x, scale, shift, y, gate)
    ok, err, allowed = within_tolerance(out, truth(h, scale, shift, 1e-6), ada_layer_norm_ref(h, scale, shift, 1e-6))
    assert ok, f"{arch}: max err {err:.3g} > allowed {allowed:.3g}"


# Every format per row; the fp8 ones also with a bound below some values (no reduction: one scale for the tensor)
FORMAT_BOUNDS = [(fmt, 0.0) for fmt in FORMATS] + [(fmt, 2.5) for fmt in FORMATS if fmt != "int8"]


# One wave a row (320), SD3.5 Large's 2432 (row groups of several waves: their maximum crosses the block's barrier),
# Flux's 3072; a NaN in one row.
@pytest.mark.parametrize("fmt, bound", FORMAT_BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gated", [False, True], ids=["ada_layer_norm", "add_ada_layer_norm"])
@pytest.mark.parametrize("shape", [(3, 5, 320), (2, 2, 2432), (1, 3, 3072)], ids=str)
def test_quantized_output_is_the_plain_outputs_quantization(emulated, shape, gated, dtype, fmt, bound):
    arch, lib = emulated
    x, shift, scale, gate = make(shape, dtype, "cpu")
    x[0, 1, 7] = float("nan")
    y = torch.randn_like(x) if gated else None
    h_plain, out = _emulate(lib, x, scale, shift, y, gate if gated else None)
    rows = shape[0] * shape[1]
    q = torch.full(shape, 0x55, dtype=torch.uint8)
    q_scale = torch.full((rows,), float("nan"))
    h = None if y is None else torch.full_like(x, float("nan"))
    b, tokens, c = shape
    run(lib.rsd_emu_ada_layer_norm_quantized, pointer(x), pointer(y), pointer(gate if gated else None),
        pointer(scale), pointer(shift), pointer(h), DTYPE_CODES[dtype], b, tokens, c,
        _strides(gate if gated else scale), _strides(scale), _strides(shift), 1e-6, pointer(q), pointer(q_scale),
        FORMATS[fmt][0], bound)
    q_ref, scale_ref = quantize_rows_ref(out.reshape(rows, c), fmt, bound)
    assert torch.equal(q_scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0)), f"{arch} {fmt}: row scales differ"
    assert same_codes(q.reshape(rows, c), q_ref), f"{arch} {fmt}: codes differ"
    if gated:
        assert torch.equal(h.nan_to_num(7.0), h_plain.nan_to_num(7.0)), f"{arch}: h differs from the plain kernel's"
