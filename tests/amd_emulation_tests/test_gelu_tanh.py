"""gelu_tanh and gelu_tanh_quantized (hip/gelu_tanh/gelu_tanh.hip) under the emulation: the elementwise kernel's
vectors and scalar tail, with and without a bias, against float64; the quantized rows bit for bit the definition's
quantization of the plain kernel's output, their maximum joined across a row block's waves."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES, within_tolerance
from rocm_sd.ops.gelu_tanh import gelu_tanh_ref
from rocm_sd.ops.quantize import FORMATS, quantize_rows_ref
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_quantize_rows import same_codes

pytestmark = MARKS
LIBRARIES = {"emulated": ["gelu_tanh"]}  # built before the first test, with the others (tests/conftest.py)


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    return request.param, library(request.param, LIBRARIES["emulated"], rsd_emu_gelu_tanh=[ctypes.c_void_p] * 3 + [
        ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int])


def _emulate(lib, x, bias, quantized=None):
    rows, d = x.numel() // x.shape[-1], x.shape[-1]
    if quantized is None:
        y = torch.full_like(x, float("nan"))  # poisoned: every element must be written
        run(lib.rsd_emu_gelu_tanh, pointer(x), pointer(bias), pointer(y), DTYPE_CODES[x.dtype], rows, d, None, None, 0)
        return y
    q = torch.full((rows, d), 0x55, dtype=torch.uint8)
    scale = torch.full((rows,), float("nan"))
    run(lib.rsd_emu_gelu_tanh, pointer(x), pointer(bias), None, DTYPE_CODES[x.dtype], rows, d, pointer(q),
        pointer(scale), FORMATS[quantized][0])
    return q, scale


# 8-wide vectors (64), the scalar tail (7), SD3.5 Large's feed-forward (9728: a row block of several waves), Flux's
# (12288: the largest row block).
@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("shape", [(3, 64), (5, 7), (2, 9728)], ids=str)
def test_gelu_tanh(emulated, shape, with_bias, dtype):
    arch, lib = emulated
    x = (torch.randn(shape) * 3).to(dtype)
    bias = torch.randn(shape[-1]).to(dtype) if with_bias else None
    y = _emulate(lib, x, bias)
    ok, err, allowed = within_tolerance(y, gelu_tanh_ref(x.double(), None if bias is None else bias.double()),
                                        gelu_tanh_ref(x, bias))
    assert ok, f"{arch} {shape} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"


@pytest.mark.parametrize("fmt", list(FORMATS), ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("shape", [(3, 64), (2, 9728), (1, 12288)], ids=str)
def test_quantized_rows_are_the_plain_outputs_quantization(emulated, shape, with_bias, dtype, fmt):
    arch, lib = emulated
    x = (torch.randn(shape) * 3).to(dtype)
    x[0, 5] = float("nan")  # its row's scale NaN
    bias = torch.randn(shape[-1]).to(dtype) if with_bias else None
    y = _emulate(lib, x, bias)
    q, scale = _emulate(lib, x, bias, fmt)
    q_ref, scale_ref = quantize_rows_ref(y, fmt)
    assert torch.equal(scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0)), f"{arch} {fmt}: row scales differ"
    assert same_codes(q, q_ref), f"{arch} {fmt}: codes differ"
