"""rms_norm (hip/rms_norm/rms_norm.hip) under the emulation: groups of lanes per row on wave64 and wave32, strided
and fused-QKV inputs, lead rows, the rotary embedding, rows in registers and rows read twice."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_rms_norm import _judge, _poisoned, make

pytestmark = MARKS
LIBRARIES = {"emulated": ["rms_norm"]}  # built before the first test, with the others (tests/conftest.py)


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    return request.param, library(request.param, LIBRARIES["emulated"], rsd_emu_rms_norm=[ctypes.c_void_p] * 7 + [
        ctypes.c_int] * 2 + [ctypes.c_int64] * 11 + [ctypes.c_float])


# (batch, len, heads, head_dim, lead_len, rope, fused), as tests/shapes.py's RMS_NORM_*: head dim 40 (five 8-wide
# vectors: a group of 8 lanes with 3 idle), 128 (16 lanes), 64 in float32 (16 lanes of 4), 6 with rope (2-wide vectors),
# 33 (scalar), no lead rows (L0 = 0); T5's 4096 (wave64: 8 vectors a lane in registers; wave32 and float32: read twice).
SHAPES = [(3, 7, 3, 40, 5, True, True), (1, 5, 4, 128, 3, True, False), (2, 3, 2, 64, None, False, True),
          (2, 5, 3, 6, 2, True, False), (2, 3, 2, 33, 1, False, False), (1, 6, 2, 16, 0, True, False),
          (1, 3, 1, 4096, None, False, False)]


def _strides(t):
    return [s if n > 1 else 0 for n, s in zip(t.shape[:3], t.stride()[:3])] if t is not None else [0, 0, 0]


@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rms_norm(emulated, shape, dtype):
    arch, lib = emulated
    args = make(shape, dtype, "cpu", repeated=shape[0] != 3)  # batch 3: rotary tables whose pairs differ
    x, weight, eps, lead, lead_weight, cos, sin = args
    y = _poisoned(args)  # every element must be written
    b, l, h, d = x.shape
    run(lib.rsd_emu_rms_norm, pointer(x), pointer(weight), pointer(lead), pointer(lead_weight), pointer(cos),
        pointer(sin), pointer(y), DTYPE_CODES[dtype], DTYPE_CODES[weight.dtype], b, l,
        lead.shape[1] if lead is not None else 0, h, d, *_strides(x), *_strides(lead), eps)
    _judge(args, y, f"{arch} {shape} {dtype}")


def test_float32_weights_without_a_lead_weight(emulated):
    arch, lib = emulated
    args = make((2, 4, 3, 64, 3, True, False), torch.bfloat16, "cpu", param_dtype=torch.float32)
    x, weight, eps, lead, _, cos, sin = args
    args = (x, weight, eps, lead, None, cos, sin)
    y = _poisoned(args)
    run(lib.rsd_emu_rms_norm, pointer(x), pointer(weight), pointer(lead), None, pointer(cos), pointer(sin),
        pointer(y), DTYPE_CODES[x.dtype], DTYPE_CODES[torch.float32], 2, 4, 3, 3, 64, *_strides(x), *_strides(lead),
        eps)
    _judge(args, y, f"{arch} float32 weight, no lead weight")
