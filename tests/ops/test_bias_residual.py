import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.ops._common import within_tolerance
from rocm_sd.ops.bias_residual import bias_residual_kernel, bias_residual_ref, input_reasons, supports

SHAPES = [(2, 320, 64, 64), (2, 1280, 8, 8), (1, 128, 512, 512), (3, 5, 7, 9), (2, 36, 1, 1)]


def make(shape, dtype, device, channels_last):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(shape, device=device).to(dtype).contiguous(memory_format=fmt)
    r = torch.randn(shape, device=device).to(dtype).contiguous(memory_format=fmt)
    bias = torch.randn(shape[1], device=device).to(dtype)
    return x, r, bias


def test_cpu_fallback_is_the_reference_and_keeps_the_layout():
    x, r, bias = make((2, 8, 4, 4), torch.float32, "cpu", True)
    with config.override(log_fallbacks=False):
        y = torch.ops.rocm_sd.bias_residual(x, r, bias, 0.5)
    assert torch.equal(y, bias_residual_ref(x, r, bias, 0.5))
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert dispatch.stats()["bias_residual"] == {"torch": 1}


def test_mismatched_layouts_are_named():
    x, r, bias = make((2, 8, 4, 4), torch.float16, "cpu", True)
    assert any("not one dense layout" in reason for reason in input_reasons(x, r.contiguous(), bias))
    assert any("does not match" in reason for reason in input_reasons(x, r[:1], bias))
    assert any("(C,) vector" in reason for reason in input_reasons(x, r, bias[:4]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_truth(shape, channels_last, dtype):
    x, r, bias = make(shape, dtype, "cuda", channels_last)
    assert not supports(x, r, bias, 1.0)
    out = torch.full_like(x, float("nan"))
    y = bias_residual_kernel(x, r, bias, 1.0, out=out)
    truth = bias_residual_ref(x.double(), r.double(), bias.double(), 1.0)
    ok, err, allowed = within_tolerance(y, truth, bias_residual_ref(x, r, bias, 1.0))
    assert ok, (err, allowed)
    assert torch.allclose(bias_residual_kernel(x, r, bias, 0.5).float(), y.float() * 0.5, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
def test_op_dispatches_to_kernel_in_strict_mode():
    x, r, bias = make((2, 320, 16, 16), torch.float16, "cuda", True)
    with config.override(strict=True):
        y = torch.ops.rocm_sd.bias_residual(x, r, bias, 1.0)
    assert dispatch.stats()["bias_residual"] == {"rocm_sd": 1}
    assert y.is_contiguous(memory_format=torch.channels_last)
