"""bias_residual (hip/bias_residual/bias_residual.hip) under the emulation, NCHW and NHWC."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES, NCHW, NHWC, within_tolerance
from rocm_sd.ops.bias_residual import bias_residual_ref
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_bias_residual import make

pytestmark = MARKS
LIBRARIES = {"emulated": ["bias_residual"]}


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    return request.param, library(request.param, LIBRARIES["emulated"], rsd_emu_bias_residual=[ctypes.c_void_p] * 4 + [
        ctypes.c_int] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_float])


# Scalar accesses in both layouts (3 x 5 x 7 x 9); 1x1 images (NCHW scalar, NHWC 4-wide); 16-byte vectors in both
# layouts with more vectors than the grid's threads (the grid-stride loop turns).
SHAPES = [(3, 5, 7, 9), (2, 36, 1, 1), (2, 40, 33, 32)]


@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bias_residual(emulated, shape, channels_last, dtype):
    arch, lib = emulated
    x, r, bias = make(shape, dtype, "cpu", channels_last)
    y = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    n, c, h, w = shape
    scale = 0.5  # ResnetBlock2D's output_scale_factor 2
    run(lib.rsd_emu_bias_residual, pointer(x), pointer(r), pointer(bias), pointer(y), DTYPE_CODES[dtype],
        NHWC if channels_last else NCHW, n, c, h * w, scale)
    truth = bias_residual_ref(x.double(), r.double(), bias.double(), scale)
    ok, err, allowed = within_tolerance(y, truth, bias_residual_ref(x, r, bias, scale))
    assert ok, f"{arch} {shape} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"
