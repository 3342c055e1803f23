"""The kernels that quantize their own output (ops/quantized_outputs.py): y is the plain kernel's y bit for bit, and
(q, scale) is rocm_sd::quantize_rows of that y bit for bit, so an 8-bit GEMM gets the same operands fused or not; with
a bound, quantize_rows_ref(y, format, bound): one scale for every row, values beyond the bound saturated."""
import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.ops.geglu import geglu_kernel
from rocm_sd.ops.layer_norm import add_layer_norm_kernel, layer_norm_kernel
from rocm_sd.ops.quantize import FORMATS, quantize_rows_ref
from rocm_sd.ops.quantized_outputs import (add_layer_norm_quantize_rows, add_layer_norm_quantize_rows_kernel,
                                           add_layer_norm_quantize_rows_ref, add_layer_norm_quantized,
                                           add_layer_norm_quantized_kernel, add_layer_norm_quantized_ref,
                                           geglu_quantize_rows,
                                           geglu_quantize_rows_kernel, geglu_quantize_rows_ref, geglu_quantized,
                                           geglu_quantized_kernel, geglu_quantized_ref,
                                           layer_norm_quantize_rows, layer_norm_quantize_rows_kernel,
                                           layer_norm_quantize_rows_ref, layer_norm_quantized,
                                           layer_norm_quantized_kernel, layer_norm_quantized_ref)
from tests.ops.test_layer_norm import make
from tests.ops.test_quantize_rows import rows_within_a_code, same_codes
from tests.shapes import GEGLU_SD, LAYER_NORM_SD

# ------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_cpu_calls_take_the_definition(fmt):
    x, w, b = make((2, 6, 64), torch.float16, "cpu")
    r = torch.randn_like(x)
    g = torch.randn(2, 6, 128, dtype=torch.float16)
    with config.override(log_fallbacks=False):
        outputs = [(layer_norm_quantize_rows(x, w, b, 1e-5, fmt), layer_norm_quantize_rows_ref(x, w, b, 1e-5, fmt)),
                   (add_layer_norm_quantize_rows(x, r, w, b, 1e-5, fmt),
                    add_layer_norm_quantize_rows_ref(x, r, w, b, 1e-5, fmt)),
                   (layer_norm_quantized(x, w, b, 1e-5, fmt), layer_norm_quantized_ref(x, w, b, 1e-5, fmt)),
                   (add_layer_norm_quantized(x, r, w, b, 1e-5, fmt), add_layer_norm_quantized_ref(x, r, w, b, 1e-5, fmt)),
                   (geglu_quantize_rows(g, fmt), geglu_quantize_rows_ref(g, fmt)),
                   (geglu_quantized(g, fmt), geglu_quantized_ref(g, fmt))]
    for got, want in outputs:
        assert len(got) == len(want)
        for a, e in zip(got, want):
            assert a.dtype == e.dtype and a.shape == e.shape and torch.equal(a.float(), e.float())


def test_cpu_calls_with_a_bound_take_one_scale_for_every_row():
    """With a bound every row's scale is bound / fmax; the codes are the float64 quotient rounded to the format, and
    values beyond the bound saturate at the format's largest value."""
    x, w, b = make((2, 6, 64), torch.float16, "cpu")
    with config.override(log_fallbacks=False):
        y, q, scale = layer_norm_quantize_rows(x, w, b, 1e-5, "e4m3fn", 1.5)
    fmax = FORMATS["e4m3fn"][2]
    assert torch.equal(scale, torch.full_like(scale, 1.5 / fmax))
    quotient = y.double() * fmax / 1.5
    assert quotient.abs().max() > fmax  # some values are beyond the bound
    want = quotient.clamp(-fmax, fmax).float().to(torch.float8_e4m3fn)
    assert torch.equal(q.float(), want.float())
    assert q.float().abs().max() == fmax


@pytest.mark.parametrize("bound, why", [(-1.0, "not 0 .* or a finite positive"), (float("nan"), "finite positive"),
                                         (float("inf"), "finite positive")])
def test_bad_bounds_are_named(bound, why):
    x, w, b = make((2, 6, 64), torch.float16, "cpu")
    with pytest.raises(RuntimeError, match=why):
        layer_norm_quantize_rows(x, w, b, 1e-5, "e4m3fn", bound)
    with pytest.raises(RuntimeError, match=why):
        geglu_quantized(torch.randn(2, 8, dtype=torch.float16), "e4m3fnuz", bound)


def test_int8_takes_no_bound():
    with pytest.raises(RuntimeError, match="needs an fp8 format, not int8"):
        geglu_quantize_rows(torch.randn(2, 8, dtype=torch.float16), "int8", 3.0)


def test_wrong_format_and_odd_geglu_are_named():
    x, w, b = make((2, 6, 64), torch.float16, "cpu")
    with pytest.raises(RuntimeError, match="format 'fp4' is not one of"):
        layer_norm_quantize_rows(x, w, b, 1e-5, "fp4")
    with pytest.raises(RuntimeError, match="last dimension 7 is odd"):
        geglu_quantize_rows(torch.randn(2, 7, dtype=torch.float16), "int8")


# ------------------------------------------------------------------------------------------- GPU

def _poisoned(shape, fmt):
    return (torch.full(shape, 0x55, dtype=torch.uint8, device="cuda").view(FORMATS[fmt][1]),
            torch.full(shape[:-1], float("nan"), device="cuda"))


# (format, bound): every format per row, the fp8 ones also with a bound below some of the values (they saturate)
FORMAT_BOUNDS = [(fmt, 0.0) for fmt in FORMATS] + [(fmt, 2.5) for fmt in FORMATS if fmt != "int8"]


def _assert_quantization_of(y, q, scale, fmt, bound=0.0):
    q_ref, scale_ref = quantize_rows_ref(y, fmt, bound)
    assert torch.equal(scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0)), "row scales differ"
    assert same_codes(q, q_ref), "codes differ"


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, bound", FORMAT_BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", LAYER_NORM_SD + [(3, 7, 2048)], ids=str)
def test_layer_norm_kernels_quantize_their_own_output(shape, dtype, fmt, bound):
    x, w, b = make(shape, dtype, "cuda")
    x.view(-1, shape[-1])[1, 3] = float("nan")  # its row only: scale NaN there (its codes NaN with a bound)
    r = torch.randn_like(x)
    y, q, scale = layer_norm_quantize_rows_kernel(x, w, b, 1e-5, fmt, bound,
                                                  out=(torch.full_like(x, float("nan")), *_poisoned(shape, fmt)))
    assert torch.equal(y.nan_to_num(7.0), layer_norm_kernel(x, w, b, 1e-5).nan_to_num(7.0))
    _assert_quantization_of(y, q, scale, fmt, bound)
    assert scale.view(-1)[1].isnan() == (bound == 0) and not scale.view(-1)[0].isnan()
    total, y, q, scale = add_layer_norm_quantize_rows_kernel(
        x, r, w, b, 1e-5, fmt, bound, out=(torch.full_like(x, float("nan")), torch.full_like(x, float("nan")),
                                           *_poisoned(shape, fmt)))
    total_plain, y_plain = add_layer_norm_kernel(x, r, w, b, 1e-5)
    assert torch.equal(total.nan_to_num(7.0), total_plain.nan_to_num(7.0))
    assert torch.equal(y.nan_to_num(7.0), y_plain.nan_to_num(7.0))
    _assert_quantization_of(y, q, scale, fmt, bound)
    # without y: the same rows (and sum), y's memory untouched
    q_alone, scale_alone = layer_norm_quantized_kernel(x, w, b, 1e-5, fmt, bound, out=_poisoned(shape, fmt))
    _assert_quantization_of(layer_norm_kernel(x, w, b, 1e-5), q_alone, scale_alone, fmt, bound)
    total_alone, q_alone, scale_alone = add_layer_norm_quantized_kernel(
        x, r, w, b, 1e-5, fmt, bound, out=(torch.full_like(x, float("nan")), *_poisoned(shape, fmt)))
    assert torch.equal(total_alone.nan_to_num(7.0), total_plain.nan_to_num(7.0))
    _assert_quantization_of(y_plain, q_alone, scale_alone, fmt, bound)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, bound", FORMAT_BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", GEGLU_SD + [(3, 5, 14), (1, 1, 2), (2, 2 * 20000)], ids=str)
def test_geglu_kernels_quantize_their_own_output(shape, dtype, fmt, bound):
    """geglu_quantize_rows writes y and its rows; geglu_quantized the same rows without y (with a bound at any row
    length: the elementwise kernel; without, up to a row block's), up to its GELU's other rounding (geglu.hip's
    gelu_for_8bit): within a code step, and at most 1% of the codes differing."""
    x = (torch.randn(shape, device="cuda") * 2).to(dtype)
    d = shape[-1] // 2
    out = (torch.full(shape[:-1] + (d,), float("nan"), dtype=dtype, device="cuda"), *_poisoned(shape[:-1] + (d,), fmt))
    y, q, scale = geglu_quantize_rows_kernel(x, fmt, bound, out=out)
    assert torch.equal(y, geglu_kernel(x))
    _assert_quantization_of(y, q, scale, fmt, bound)
    if d > 16384 and bound == 0:
        return  # test_geglu_quantized_needs_y_for_rows_longer_than_a_block
    q, scale = geglu_quantized_kernel(x, fmt, bound, out=_poisoned(shape[:-1] + (d,), fmt))
    problem = rows_within_a_code(q, scale, *quantize_rows_ref(y, fmt, bound), fmt)
    assert not problem, problem


@pytest.mark.gpu
def test_geglu_quantized_needs_y_for_rows_longer_than_a_block():
    from rocm_sd.ops.quantized_outputs import GEGLU_QUANTIZED_SPEC

    x = torch.randn(2, 2 * 20000, device="cuda", dtype=torch.float16)  # 2500 8-wide vectors: over 1024 threads x 2
    assert any("y is needed" in r for r in GEGLU_QUANTIZED_SPEC.supports(x, "e4m3fn"))
    with config.override(strict=False, log_fallbacks=False):
        q, scale = geglu_quantized(x, "e4m3fn")  # the definition instead
    want_q, want_scale = geglu_quantized_ref(x, "e4m3fn")
    assert same_codes(q, want_q) and torch.equal(scale, want_scale)


@pytest.mark.gpu
def test_ops_run_the_kernels_where_they_can_and_name_why_not():
    x, w, b = make((2, 64, 320), torch.float16, "cuda")
    with config.override(strict=True):
        dispatch.reset_stats()
        layer_norm_quantize_rows(x, w, b, 1e-5, "int8")
        add_layer_norm_quantize_rows(x, x, w, b, 1e-5, "e4m3fn")
        geglu_quantize_rows(torch.randn(2, 64, 640, device="cuda", dtype=torch.float16), "e4m3fnuz")
        geglu_quantized(torch.randn(2, 64, 640, device="cuda", dtype=torch.float16), "int8")
        layer_norm_quantized(x, w, b, 1e-5, "e4m3fnuz", 3.0)
        add_layer_norm_quantized(x, x, w, b, 1e-5, "int8")
        stats = dispatch.stats()
        for op in ("layer_norm_quantize_rows", "add_layer_norm_quantize_rows", "geglu_quantize_rows",
                   "geglu_quantized", "layer_norm_quantized", "add_layer_norm_quantized"):
            assert stats[op] == {"rocm_sd": 1}, stats
    from rocm_sd.ops.quantized_outputs import LN_SPEC
    assert any("fp16 or bf16" in r for r in LN_SPEC.supports(x.float(), w.float(), b.float(), 1e-5, "int8"))
    x33, w33, b33 = make((2, 4, 33), torch.float16, "cuda")
    assert any("multiple of 8 channels" in r for r in LN_SPEC.supports(x33, w33, b33, 1e-5, "int8"))
