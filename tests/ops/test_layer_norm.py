import pytest
import torch
from torch import nn

from rocm_sd import config, dispatch
from rocm_sd.modules import RocmLayerNorm
from rocm_sd.ops._common import within_tolerance
from tests.shapes import LAYER_NORM_SD
from rocm_sd.ops.layer_norm import (add_layer_norm_kernel, add_layer_norm_ref, add_layer_norm_supports, input_reasons,
                                     layer_norm_kernel, layer_norm_ref, supports)

LAYER_NORM_AWKWARD = [(3, 7, 33), (1, 1, 8), (5, 2048), (4, 77, 768)]


def make(shape, dtype, device, param_dtype=None):
    x = (torch.randn(shape, device=device) * 2 + 0.5).to(dtype)
    c = shape[-1]
    w = (torch.rand(c, device=device) + 0.5).to(param_dtype or dtype)
    b = torch.randn(c, device=device).to(param_dtype or dtype)
    return x, w, b


def test_module_is_nn_layer_norm_and_falls_back_exactly():
    ln = nn.LayerNorm(64, eps=1e-6)
    fused = RocmLayerNorm.from_layer_norm(ln)
    assert fused.weight is ln.weight and fused.state_dict().keys() == ln.state_dict().keys()
    x = torch.randn(2, 5, 64)
    with torch.no_grad(), config.override(log_fallbacks=False):
        assert torch.equal(fused(x), ln(x))
    assert dispatch.stats()["layer_norm"] == {"torch": 1}


def test_unsupported_arguments_are_named():
    x, w, b = make((2, 8, 64), torch.float16, "cpu")
    assert any("not contiguous" in r for r in input_reasons(x.transpose(0, 1), w, b))
    assert any("dtype torch.float64" in r for r in input_reasons(x.double(), w.double(), b.double()))
    assert any("contiguous (64,) vector" in r for r in input_reasons(x, w[:32], b))
    assert any("empty" in r for r in supports(x[:0], w, b, 1e-5))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", LAYER_NORM_SD + LAYER_NORM_AWKWARD, ids=str)
def test_kernel_matches_truth(shape, dtype):
    x, w, b = make(shape, dtype, "cuda")
    assert not supports(x, w, b, 1e-5), supports(x, w, b, 1e-5)
    y = layer_norm_kernel(x, w, b, 1e-5, out=torch.full_like(x, float("nan")))
    ok, err, allowed = within_tolerance(y, layer_norm_ref(x.double(), w.double(), b.double(), 1e-5),
                                        layer_norm_ref(x, w, b, 1e-5))
    assert ok, f"{shape} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"


@pytest.mark.gpu
def test_kernel_fp32_params_no_affine_and_large_mean():
    x, w, b = make((2, 256, 640), torch.float16, "cuda", param_dtype=torch.float32)
    ok, err, allowed = within_tolerance(layer_norm_kernel(x, w, b, 1e-5), layer_norm_ref(x.double(), w.double(),
                                        b.double(), 1e-5), layer_norm_ref(x.float(), w, b, 1e-5).half())
    assert ok, (err, allowed)
    x = torch.randn(64, 320, device="cuda") * 0.01 + 100.0  # two-pass variance: no cancellation
    ok, err, allowed = within_tolerance(layer_norm_kernel(x, None, None, 1e-6), layer_norm_ref(x.double(), None, None,
                                        1e-6), layer_norm_ref(x, None, None, 1e-6))
    assert ok, (err, allowed)


@pytest.mark.gpu
def test_too_wide_rows_fall_back_with_a_reason():
    x, w, b = make((4, 65536), torch.float16, "cuda")
    assert any("too large" in r for r in supports(x, w, b, 1e-5))
    with config.override(strict=False, log_fallbacks=False):  # the GPU suite runs with ROCM_SD_STRICT=1
        assert torch.equal(torch.ops.rocm_sd.layer_norm(x, w, b, 1e-5), layer_norm_ref(x, w, b, 1e-5))


# ---- add_layer_norm (SkipLayerNorm) ---------------------------------------------------------------------

def test_add_layer_norm_falls_back_exactly_and_names_bad_residuals():
    x, w, b = make((2, 8, 64), torch.float16, "cpu")
    r = torch.randn_like(x)
    with config.override(log_fallbacks=False):
        total, y = torch.ops.rocm_sd.add_layer_norm(x, r, w, b, 1e-5)
    ref_total, ref_y = add_layer_norm_ref(x, r, w, b, 1e-5)
    assert torch.equal(total, ref_total) and torch.equal(y, ref_y)
    assert any("residual dtype" in why for why in add_layer_norm_supports(x, r.float(), w, b, 1e-5))
    assert any("residual of shape" in why for why in add_layer_norm_supports(x, r[:1], w, b, 1e-5))
    assert any("residual strides" in why for why in add_layer_norm_supports(x, r.transpose(0, 1).contiguous().transpose(0, 1), w, b, 1e-5))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", LAYER_NORM_SD + LAYER_NORM_AWKWARD, ids=str)
def test_add_layer_norm_kernel_matches_truth(shape, dtype):
    x, w, b = make(shape, dtype, "cuda")
    r = torch.randn_like(x)
    assert not add_layer_norm_supports(x, r, w, b, 1e-5), add_layer_norm_supports(x, r, w, b, 1e-5)
    poisoned = (torch.full_like(x, float("nan")), torch.full_like(x, float("nan")))
    total, y = add_layer_norm_kernel(x, r, w, b, 1e-5, out=poisoned)
    # The sum is rounded to the dtype exactly as torch's add rounds it.
    assert torch.equal(total, x + r)
    # The norm is judged against the float64 norm of that rounded sum, as the unfused block computes it.
    ok, err, allowed = within_tolerance(y, layer_norm_ref(total.double(), w.double(), b.double(), 1e-5),
                                        layer_norm_ref(total, w, b, 1e-5))
    assert ok, f"{shape} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"


@pytest.mark.gpu
def test_add_layer_norm_nan_stays_in_its_row():
    x, w, b = make((4, 320), torch.float16, "cuda")
    r = torch.randn_like(x)
    r[2, 17] = float("nan")
    total, y = torch.ops.rocm_sd.add_layer_norm(x, r, w, b, 1e-5)
    assert torch.isnan(total[2, 17]) and torch.isnan(y[2]).all()
    assert not torch.isnan(y[[0, 1, 3]]).any() and torch.isnan(total).sum() == 1
