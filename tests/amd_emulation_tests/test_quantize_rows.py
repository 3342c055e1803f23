"""quantize_rows (hip/quantize/quantize_rows.hip) under the emulation: wave32 and wave64 reductions, and the
software fp8 / int8 encodings, bit for bit against the definition (ops/quantize.py)."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES
from rocm_sd.ops.quantize import FORMATS, quantize_rows_ref
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_quantize_rows import QUANTIZE_SHAPES, every_fp16_value, make_rows, same_codes

pytestmark = MARKS
LIBRARIES = {"emulated": ["quantize_rows"]}


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    return request.param, library(request.param, LIBRARIES["emulated"], rsd_emu_quantize_rows=[ctypes.c_void_p] * 3 + [
        ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64], rsd_emu_quantize_batched_rows=[ctypes.c_void_p] * 3 + [
        ctypes.c_int, ctypes.c_int] + [ctypes.c_int64] * 4)


def _run(lib, x, fmt):
    q = torch.full(x.shape, 0x55, dtype=torch.uint8)  # poisoned
    scale = torch.full(x.shape[:-1], float("nan"))
    k = x.shape[-1]
    run(lib.rsd_emu_quantize_rows, pointer(x), pointer(q), pointer(scale), DTYPE_CODES[x.dtype], FORMATS[fmt][0],
        x.numel() // k, k)
    return q, scale


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("shape", QUANTIZE_SHAPES, ids=str)
def test_quantize_rows(emulated, shape, dtype, fmt):
    arch, lib = emulated
    x = make_rows(shape, dtype, "cpu")
    q, scale = _run(lib, x, fmt)
    q_ref, scale_ref = quantize_rows_ref(x, fmt)
    assert torch.equal(scale, scale_ref), f"{arch} {shape} {dtype} {fmt}: row scales differ"
    assert torch.equal(q, q_ref.view(torch.uint8)), f"{arch} {shape} {dtype} {fmt}: codes differ"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_fp16_value_encodes_as_torch_does(emulated, fmt):
    """Every fp16 bit pattern v in a row [fmax, v]: the row's scale is 1 wherever |v| <= fmax, so v itself is encoded,
    and every fp8 code, subnormals, ties and saturation included, meets the software encoder; larger v, the
    infinities and the NaNs take the scaling and NaN paths."""
    arch, lib = emulated
    x = every_fp16_value(fmt)
    q, scale = _run(lib, x, fmt)
    q_ref, scale_ref = quantize_rows_ref(x, fmt)
    assert torch.equal(scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0))
    assert same_codes(q, q_ref), f"{arch} {fmt}: codes differ"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("part", ["image", "text"])
def test_batches_of_rows_are_read_where_they_lie(emulated, part, dtype):
    """x[:, :L] and x[:, L:] of a joint attention output (B, L + L_txt, K), quantized in place."""
    arch, lib = emulated
    joint = make_rows((3, 7 + 5, 40), dtype, "cpu")
    x = joint[:, :7] if part == "image" else joint[:, 7:]
    q = torch.full(x.shape, 0x55, dtype=torch.uint8)
    scale = torch.full(x.shape[:-1], float("nan"))
    run(lib.rsd_emu_quantize_batched_rows, pointer(x), pointer(q), pointer(scale), DTYPE_CODES[dtype],
        FORMATS["e4m3fn"][0], x.shape[0] * x.shape[1], x.shape[2], x.shape[1], x.stride(0))
    q_ref, scale_ref = quantize_rows_ref(x.contiguous(), "e4m3fn")
    assert torch.equal(scale, scale_ref) and same_codes(q, q_ref), arch
