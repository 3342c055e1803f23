"""im2col_quantize (hip/im2col_quantize/im2col_quantize.hip) under the emulation: the grid-stride loop, its four
divisions and the software fp8 encodings at wave64 and wave32, bit for bit against the definition
(ops/im2col_quantize.py)."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES
from rocm_sd.ops.im2col_quantize import im2col_quantize_ref
from rocm_sd.ops.quantize import FORMATS
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_im2col_quantize import SHAPES, channels_last
from tests.ops.test_quantize_rows import same_codes

pytestmark = MARKS
LIBRARIES = {"emulated": ["im2col_quantize"]}


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    return request.param, library(request.param, LIBRARIES["emulated"],
                                  rsd_emu_im2col_quantize=[ctypes.c_void_p] * 3 + [
        ctypes.c_int, ctypes.c_int] + [ctypes.c_int64] * 4 + [ctypes.c_int] * 6 + [ctypes.c_float])


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_im2col_quantize(emulated, shape, dtype, fmt):
    arch, lib = emulated
    n, c, h, w, k, s, p = shape
    x = channels_last(n, c, h, w, dtype=dtype, scale=2.0)
    q_ref, scale_ref = im2col_quantize_ref(x, fmt, 5.0, k, k, s, s, p, p)
    q = torch.full(q_ref.shape, 0x55, dtype=torch.uint8)  # poisoned
    scale = torch.full((), float("nan"))
    run(lib.rsd_emu_im2col_quantize, pointer(x), pointer(q), pointer(scale), DTYPE_CODES[dtype], FORMATS[fmt][0],
        n, h, w, c, k, k, s, s, p, p, 5.0)
    assert torch.equal(scale, scale_ref), f"{arch} {shape} {dtype} {fmt}: scales differ"
    assert same_codes(q.view(q_ref.dtype), q_ref), f"{arch} {shape} {dtype} {fmt}: codes differ"
