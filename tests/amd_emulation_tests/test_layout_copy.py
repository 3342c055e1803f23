"""layout_copy (hip/layout_copy.hip) under the emulation: the tiled and the register kernels, both directions."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_layout_copy import make

pytestmark = MARKS


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int] + [ctypes.c_int64] * 3 + [ctypes.c_int]
    return request.param, library(request.param, ["layout_copy"], rsd_emu_layout_copy=argtypes,
                                  rsd_emu_layout_copy_describe=argtypes)


# (N, C, H, W), and the kernel layout_copy_describe reports for 16-bit types (vector width, tiles): whole 64 x 64
# tiles (the tiled kernel through shared memory); 72 channels by 9 x 40 (the register kernel's 8 x 8 blocks of 16-bit
# pairs, partial blocks on both axes); widths 2 and 1 (6 channels by 5 x 6, 5 by 7 x 9 with batch 3).
SHAPES = [((2, 64, 8, 16), "vec=8 tile=64x64"), ((2, 72, 9, 40), "vec=8"), ((1, 6, 5, 6), "vec=2"),
          ((3, 5, 7, 9), "vec=1")]


@pytest.mark.parametrize("to_channels_last", [True, False], ids=["to_nhwc", "to_nchw"])
@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("shape, plan", SHAPES, ids=str)
def test_layout_copy(emulated, shape, plan, dtype, to_channels_last):
    arch, lib = emulated
    x = make(shape, dtype, "cpu", channels_last=not to_channels_last)
    out = torch.empty(shape, dtype=dtype,
                      memory_format=torch.channels_last if to_channels_last else torch.contiguous_format)
    out.fill_(float("nan"))  # poisoned: every element must be written
    n, c, h, w = shape
    args = (pointer(x), pointer(out), DTYPE_CODES[dtype], n, c, h * w, to_channels_last)
    if dtype != torch.float32:  # fp32 takes the register kernel at 4-wide vectors
        described = lib.rsd_emu_layout_copy_describe(*args).decode()
        assert described.split(" blocks=")[0] == plan, f"the case no longer takes its kernel: {described}"
    run(lib.rsd_emu_layout_copy, *args)
    assert torch.equal(out, x), f"{arch} {shape} {dtype}"
