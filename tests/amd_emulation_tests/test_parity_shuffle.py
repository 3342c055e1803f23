"""parity_shuffle (hip/parity_shuffle/parity_shuffle.hip) under the emulation."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES
from rocm_sd.ops.parity_shuffle import parity_shuffle_ref
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_parity_shuffle import make

pytestmark = MARKS
LIBRARIES = {"emulated": ["parity_shuffle"]}


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    return request.param, library(request.param, LIBRARIES["emulated"], rsd_emu_parity_shuffle=[ctypes.c_void_p] * 3 + [
        ctypes.c_int] + [ctypes.c_int64] * 4)


# (N, C, H, W) of the upsampled output's channels and the input resolution: the GPU tests' awkward ones (12 and 3
# channels: 4-wide and scalar accesses, odd sizes, batch 3), and 16 channels (16-byte fp16 vectors).
SHAPES = [(3, 12, 5, 7), (1, 3, 4, 4), (2, 16, 3, 6)]


@pytest.mark.parametrize("bias_on", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_parity_shuffle(emulated, shape, dtype, bias_on):
    arch, lib = emulated
    parities, bias = make(shape, dtype, "cpu", bias_on)
    expected = parity_shuffle_ref(parities, bias)
    out = torch.full_like(expected, float("nan"))  # poisoned: every element must be written
    n, c, h, w = shape
    run(lib.rsd_emu_parity_shuffle, pointer(parities), pointer(bias), pointer(out), DTYPE_CODES[dtype], n, h, w, c)
    # A copy plus one add rounded once, in the kernel and in the reference: equal bit for bit (as on the GPU).
    assert torch.equal(out, expected), f"{arch} {shape} {dtype} bias={bias_on}"
