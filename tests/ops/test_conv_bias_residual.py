"""rocm_sd::conv_bias_residual: ResnetBlock2D's second convolution and its tail, the op that hosts the Composable
Kernel convolution fusions (ck_templates/). Its default path (vendor convolution, then rocm_sd::bias_residual) runs
everywhere; the CK instances exist only in ROCm builds with CK headers (no AMD GPU here: no CK instance has run)."""
import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.ops import conv_bias_residual as conv_op
from rocm_sd.ops._common import within_tolerance


def conv_args(device="cpu", dtype=torch.float32, n=2, c=16, k=24, hw=8, pad=1, channels_last=True):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, c, hw, hw, device=device, dtype=dtype).contiguous(memory_format=fmt)
    w = (torch.randn(k, c, 3, 3, device=device, dtype=dtype) / (9 * c) ** 0.5).contiguous(memory_format=fmt)
    out_hw = hw + 2 * pad - 2
    residual = torch.randn(n, k, out_hw, out_hw, device=device, dtype=dtype).contiguous(memory_format=fmt)
    return x, w, torch.randn(k, device=device, dtype=dtype), residual, 0.5, pad, pad


def test_conv_bias_residual_default_path_is_the_convolution_then_bias_residual():
    for channels_last in (True, False):
        args = conv_args(channels_last=channels_last)
        with config.override(log_fallbacks=False):
            y = torch.ops.rocm_sd.conv_bias_residual(*args)
        assert torch.equal(y, conv_op.conv_bias_residual_ref(*args))
        assert y.stride() == args[3].stride()  # the residual's layout, as the fake kernel says
    assert dispatch.stats()["conv_bias_residual"] == {dispatch.COMPOSED: 2}


def test_ck_reasons_name_what_the_instances_cannot_take():
    x, w, bias, residual, _, pad, _ = conv_args(dtype=torch.float16)
    assert conv_op.ck_reasons(x, w, bias, residual, pad, pad) == []
    assert any("channels_last" in r for r in conv_op.ck_reasons(x.contiguous(), w, bias, residual, pad, pad))
    assert any("residual" in r for r in conv_op.ck_reasons(x, w, bias, residual, 0, 0))
    x12, w12 = (t[:, :12].contiguous(memory_format=torch.channels_last) for t in (x, w))
    assert any("multiples of 8" in r for r in conv_op.ck_reasons(x12, w12, bias, residual, pad, pad))
    assert any("fp16" in r for r in conv_op.ck_reasons(x, w, bias.float(), residual, pad, pad))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_default_path_on_the_gpu_matches_truth_and_runs_the_bias_residual_kernel(dtype):
    with config.override(strict=True):
        args = conv_args("cuda", dtype, c=320, k=320, hw=32)
        y = torch.ops.rocm_sd.conv_bias_residual(*args)
        double = tuple(a.double() if isinstance(a, torch.Tensor) else a for a in args)
        ok, err, allowed = within_tolerance(y, conv_op.conv_bias_residual_ref(*double),
                                            conv_op.conv_bias_residual_ref(*args))
        assert ok, (err, allowed)
        assert y.is_contiguous(memory_format=torch.channels_last)
    stats = dispatch.stats()
    assert stats["bias_residual"] == {"rocm_sd": 1} and stats["conv_bias_residual"] == {dispatch.COMPOSED: 1}
