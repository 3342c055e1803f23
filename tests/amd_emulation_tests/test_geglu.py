"""geglu (hip/geglu/geglu.hip) under the emulation."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES, within_tolerance
from rocm_sd.ops.geglu import geglu_ref
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_geglu import GEGLU_AWKWARD, make_input

pytestmark = MARKS
LIBRARIES = {"emulated": ["geglu"]}


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    return request.param, library(request.param, LIBRARIES["emulated"], rsd_emu_geglu=[ctypes.c_void_p] * 2 + [
        ctypes.c_int, ctypes.c_int64, ctypes.c_int64])


# The GPU tests' awkward shapes: one element, D = 7 and 333 (scalar accesses), and 77 x 1280 (16-byte vectors, more
# vectors than the grid's threads: the grid-stride loop turns).
@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("shape", GEGLU_AWKWARD, ids=str)
def test_geglu(emulated, shape, dtype):
    arch, lib = emulated
    x = make_input(shape, dtype, "cpu")
    d = shape[-1] // 2
    y = torch.full(shape[:-1] + (d,), float("nan"), dtype=dtype)  # poisoned: every element must be written
    run(lib.rsd_emu_geglu, pointer(x), pointer(y), DTYPE_CODES[dtype], x.numel() // (2 * d), d)
    ok, err, allowed = within_tolerance(y, geglu_ref(x.double()), geglu_ref(x))
    assert ok, f"{arch} {shape} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"
