"""ada_layer_norm and add_ada_layer_norm (hip/ada_layer_norm/ada_layer_norm.hip) under the emulation: one wave a row
and row groups of several waves (block barriers), 16-byte and scalar accesses, parameters as chunks of an embedding
and transposed."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES, within_tolerance
from rocm_sd.ops.ada_layer_norm import ada_layer_norm_ref
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_ada_layer_norm import make, truth

pytestmark = MARKS
LIBRARIES = {"emulated": ["ada_layer_norm"]}  # built before the first test, with the others (tests/conftest.py)

STRIDES = ctypes.c_int64 * 2


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    return request.param, library(request.param, LIBRARIES["emulated"], rsd_emu_ada_layer_norm=[ctypes.c_void_p] * 7 + [
        ctypes.c_int] + [ctypes.c_int64] * 3 + [ctypes.POINTER(ctypes.c_int64)] * 3 + [ctypes.c_float])


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
