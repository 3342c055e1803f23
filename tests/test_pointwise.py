"""1x1 convolutions as GEMMs on channels_last activations (rocm_sd/modules/pointwise.py)."""
import torch
from torch import nn

import rocm_sd
from rocm_sd import models
from rocm_sd.modules.pointwise import RocmPointwiseConv2d, is_pointwise
from rocm_sd.modules.host_copies import copy_as


def _conv(cin=24, cout=40, bias=True):
    torch.manual_seed(0)
    return nn.Conv2d(cin, cout, 1, bias=bias)


def test_same_result_and_layout_on_channels_last():
    for bias in (True, False):
        conv = _conv(bias=bias)
        gemm = copy_as(conv, RocmPointwiseConv2d)
        assert gemm.weight is conv.weight and (gemm.bias is conv.bias)
        x = torch.randn(2, 24, 6, 5).to(memory_format=torch.channels_last)
        with torch.no_grad():
            y = gemm(x)
            torch.testing.assert_close(y, conv(x), rtol=1e-5, atol=1e-5)
        assert y.is_contiguous(memory_format=torch.channels_last) and y.shape == (2, 40, 6, 5)


def test_other_layouts_and_autograd_run_the_convolution():
    conv = _conv()
    gemm = copy_as(conv, RocmPointwiseConv2d)
    x = torch.randn(2, 24, 6, 5)  # NCHW
    with torch.no_grad():
        assert torch.equal(gemm(x), conv(x))
    x_cl = x.to(memory_format=torch.channels_last).requires_grad_()
    y = gemm(x_cl)
    y.sum().backward()
    assert x_cl.grad is not None and conv.weight.grad is not None


def test_only_true_pointwise_convolutions_qualify():
    assert is_pointwise(nn.Conv2d(4, 4, 1))
    for conv in (nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 1, stride=2), nn.Conv2d(4, 4, 1, groups=2),
                 nn.Conv2d(4, 4, 1, padding=1), nn.Conv2d(4, 4, 1, padding_mode="reflect")):
        assert not is_pointwise(conv)

    class HostConv2d(nn.Conv2d):  # a host app's own class: only host copies take it
        pass

    assert not is_pointwise(HostConv2d(4, 4, 1)) and is_pointwise(HostConv2d(4, 4, 1), any_class=True)
    assert not is_pointwise(HostConv2d(4, 4, 3, padding=1), any_class=True)


def test_optimize_swaps_them_and_keeps_the_state_dict():
    pipe = models.build_sd_pipeline("tiny")
    keys = list(pipe.unet.state_dict())
    rocm_sd.optimize(pipe)
    assert rocm_sd.report(pipe)["unet"]["conv1x1 as GEMM"] >= 2  # proj_in/proj_out of the tiny transformer
    assert list(pipe.unet.state_dict()) == keys
    assert any(isinstance(m, RocmPointwiseConv2d) for m in pipe.unet.modules())
    rocm_sd.revert(pipe)
    assert not any(isinstance(m, RocmPointwiseConv2d) for m in pipe.unet.modules())
