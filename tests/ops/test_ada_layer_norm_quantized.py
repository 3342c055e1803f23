"""ada_layer_norm_quantized and add_ada_layer_norm_quantized (ops/ada_layer_norm_quantized.py): (q, row_scale) is
rocm_sd::quantize_rows of the plain kernel's modulated rows bit for bit, and h the plain kernel's h, so an 8-bit
projection gets the same operands fused or not; with a bound, one scale for every row."""
import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.ops import REGISTRY
from rocm_sd.ops.ada_layer_norm import ada_layer_norm_kernel, ada_layer_norm_ref, add_ada_layer_norm_kernel
from rocm_sd.ops.ada_layer_norm_quantized import (ADD_SPEC, SPEC, ada_layer_norm_quantized,
                                                  ada_layer_norm_quantized_kernel, ada_layer_norm_quantized_ref,
                                                  add_ada_layer_norm_quantized, add_ada_layer_norm_quantized_kernel,
                                                  add_ada_layer_norm_quantized_ref)
from rocm_sd.ops.quantize import FORMATS, quantize_rows_ref
from tests.ops.test_ada_layer_norm import make
from tests.ops.test_quantize_rows import same_codes
from tests.shapes import ADA_LAYER_NORM_DIT

FORMAT_BOUNDS = [(fmt, 0.0) for fmt in FORMATS] + [(fmt, 2.5) for fmt in FORMATS if fmt != "int8"]


def _same_quantization(q, row_scale, q_ref, scale_ref) -> bool:
    return torch.equal(row_scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0)) and same_codes(q, q_ref)


# ---- CPU ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, bound", FORMAT_BOUNDS, ids=str)
def test_cpu_calls_take_the_definition(fmt, bound):
    x, shift, scale, gate = make((2, 5, 64), torch.bfloat16, "cpu")
    y = torch.randn_like(x)
    with config.override(log_fallbacks=False):
        q, row_scale = ada_layer_norm_quantized(x, scale, shift, 1e-6, fmt, bound)
        assert _same_quantization(q, row_scale, *quantize_rows_ref(ada_layer_norm_ref(x, scale, shift, 1e-6), fmt,
                                                                   bound))
        h, q, row_scale = add_ada_layer_norm_quantized(x, y, gate, scale, shift, 1e-6, fmt, bound)
    h_ref, q_ref, scale_ref = add_ada_layer_norm_quantized_ref(x, y, gate, scale, shift, 1e-6, fmt, bound)
    assert torch.equal(h, h_ref) and _same_quantization(q, row_scale, q_ref, scale_ref)
    assert q.dtype == FORMATS[fmt][1] and row_scale.shape == (2, 5)
    if bound:
        assert torch.unique(row_scale).numel() == 1  # one scale for every row


@pytest.mark.parametrize("call, why", [
    (lambda x, s, sh: torch.ops.rocm_sd.ada_layer_norm_quantized(x, s, sh, 1e-6, "fp4", 0.0), "format 'fp4'"),
    (lambda x, s, sh: torch.ops.rocm_sd.ada_layer_norm_quantized(x, s, sh, 1e-6, "int8", 2.0), "needs an fp8 format"),
    (lambda x, s, sh: torch.ops.rocm_sd.ada_layer_norm_quantized(x, s, sh, 1e-6, "e4m3fn", -1.0), "bound -1.0"),
    (lambda x, s, sh: torch.ops.rocm_sd.add_ada_layer_norm_quantized(x, x[:, :2], s, s, sh, 1e-6, "int8", 0.0),
     "rocm_sd::add_ada_layer_norm_quantized: y of shape"),
    (lambda x, s, sh: torch.ops.rocm_sd.ada_layer_norm_quantized(x[0], s, sh, 1e-6, "int8", 0.0),
     r"rocm_sd::ada_layer_norm_quantized: input of shape \(5, 64\) has 2 dims"),
], ids=["format", "int8-bound", "negative-bound", "residual", "2-D"])
def test_bad_arguments_are_named_after_the_op(call, why):
    x, shift, scale, _ = make((2, 5, 64), torch.bfloat16, "cpu")
    with pytest.raises(RuntimeError, match=why):
        call(x, scale, shift)


def test_the_kernel_refuses_what_it_does_not_hold():
    x, shift, scale, gate = make((2, 5, 64), torch.bfloat16, "cpu")
    assert any("fp16 or bf16" in r for r in SPEC.supports(x.float(), scale.float(), shift.float(), 1e-6, "int8"))
    assert any("not contiguous" in r for r in ADD_SPEC.supports(x.transpose(0, 1), x, gate, scale, shift, 1e-6,
                                                                  "int8"))


@pytest.mark.parametrize("op", ["ada_layer_norm_quantized", "add_ada_layer_norm_quantized"])
def test_opcheck_through_the_registry(op):
    spec = REGISTRY[op]
    with config.override(log_fallbacks=False):
        for args in spec.samples("cpu", torch.bfloat16):
            torch.library.opcheck(spec.op, args)


# ---- GPU: against the plain kernel's output, bit for bit ------------------------------------------------------

def _poisoned(shape, fmt):
    return (torch.full(shape, 0x55, dtype=torch.uint8, device="cuda").view(FORMATS[fmt][1]),
            torch.full(shape[:-1], float("nan"), device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, bound", FORMAT_BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", ADA_LAYER_NORM_DIT[:3] + ADA_LAYER_NORM_DIT[5:6] + [(3, 7, 320)], ids=str)
def test_kernels_quantize_the_plain_kernels_output(shape, dtype, fmt, bound):
    x, shift, scale, gate = make(shape, dtype, "cuda")
    x[1 % shape[0], 2, 5] = float("nan")  # its row's scale NaN (its codes NaN with a bound)
    y = torch.randn_like(x)
    assert not SPEC.supports(x, scale, shift, 1e-6, fmt, bound)
    q, row_scale = ada_layer_norm_quantized_kernel(x, scale, shift, 1e-6, fmt, bound, out=_poisoned(shape, fmt))
    assert _same_quantization(q, row_scale, *quantize_rows_ref(ada_layer_norm_kernel(x, scale, shift, 1e-6), fmt,
                                                               bound))
    h_plain, n_plain = add_ada_layer_norm_kernel(x, y, gate, scale, shift, 1e-6)
    h, q, row_scale = add_ada_layer_norm_quantized_kernel(
        x, y, gate, scale, shift, 1e-6, fmt, bound, out=(torch.full_like(x, float("nan")), *_poisoned(shape, fmt)))
    assert torch.equal(h.nan_to_num(7.0), h_plain.nan_to_num(7.0))
    assert _same_quantization(q, row_scale, *quantize_rows_ref(n_plain, fmt, bound))


@pytest.mark.gpu
def test_ops_run_the_kernels_where_they_can_and_name_why_not():
    x, shift, scale, gate = make((2, 333, 2432), torch.bfloat16, "cuda")
    with config.override(strict=True):
        dispatch.reset_stats()
        ada_layer_norm_quantized(x, scale, shift, 1e-6, "e4m3fn")
        add_ada_layer_norm_quantized(x, x, gate, scale, shift, 1e-6, "int8")
        stats = dispatch.stats()
        for op in ("ada_layer_norm_quantized", "add_ada_layer_norm_quantized"):
            assert stats[op] == {"rocm_sd": 1}, stats
    x33, shift33, scale33, _ = make((2, 4, 33), torch.float16, "cuda")
    assert any("multiple of 8 channels" in r for r in SPEC.supports(x33, scale33, shift33, 1e-6, "int8"))
    transposed = torch.randn(2432, 2, device="cuda", dtype=torch.bfloat16).t()  # the scalar path: refused
    assert any("16-byte" in r for r in SPEC.supports(x, transposed, shift, 1e-6, "int8"))
    with config.override(strict=False, log_fallbacks=False):
        q, row_scale = ada_layer_norm_quantized(x, transposed, shift, 1e-6, "e4m3fn")  # the definition instead
    assert _same_quantization(q, row_scale, *ada_layer_norm_quantized_ref(x, transposed, shift, 1e-6, "e4m3fn"))
