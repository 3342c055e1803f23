"""rocm_sd::im2col_quantize (hip/im2col_quantize/) and the FP8 convolution built on it (modules/quantized_conv.py)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rocm_sd import config, dispatch
from rocm_sd.modules.quantized_conv import GroupNormBound, RocmQuantizedConv2d
from rocm_sd.ops.im2col_quantize import (im2col_quantize, im2col_quantize_kernel, im2col_quantize_ref, patches,
                                         supports)
from rocm_sd.ops.quantize import FORMATS, quantize_rows_ref
from rocm_sd.patch.precision import group_norm_bound
from tests.ops.test_quantize_rows import same_codes

FP8 = ["e4m3fn", "e4m3fnuz"]
# (N, C, H, W, window, stride, pad): SD's 3x3 convolutions (320 and 1280 channels: 16-element vectors), 24 channels
# (8-element vectors), a strided one (the downsamplers'), odd channels and sizes (scalar accesses, partial windows at
# every edge), a 1x1, a window without padding and a batch of 3.
SHAPES = [(2, 320, 8, 8, 3, 1, 1), (1, 1280, 4, 5, 3, 1, 1), (1, 24, 5, 5, 3, 1, 1), (2, 64, 9, 7, 3, 2, 1),
          (3, 3, 5, 6, 3, 1, 1), (1, 24, 6, 6, 1, 1, 0), (1, 40, 7, 3, 3, 1, 0)]


def channels_last(*shape, dtype=torch.float32, device="cpu", scale=1.0):
    return (torch.randn(*shape) * scale).to(device, dtype).contiguous(memory_format=torch.channels_last)


# ------------------------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("stride, pad", [(1, 1), (2, 1), (1, 0)])
def test_patches_times_the_weight_is_the_convolution(stride, pad):
    """The layout the GEMM multiplies: rows of output pixels, taps major and channels minor, zeros in the padding."""
    x = torch.randn(2, 5, 7, 6, dtype=torch.float64)
    w = torch.randn(4, 5, 3, 3, dtype=torch.float64)
    rows = patches(x, 3, 3, stride, stride, pad, pad).double()
    out = rows @ w.permute(0, 2, 3, 1).reshape(4, -1).t()
    ref = F.conv2d(x, w, stride=stride, padding=pad)
    assert torch.allclose(out.view(2, *ref.shape[2:], 4).permute(0, 3, 1, 2), ref, atol=1e-5)


@pytest.mark.parametrize("fmt", FP8)
def test_reference_is_quantize_rows_of_the_patches_with_one_scale(fmt):
    x = channels_last(2, 16, 5, 4) * 3
    q, scale = im2col_quantize_ref(x, fmt, 10.0, 3, 3, 1, 1, 1, 1)
    q_rows, scale_rows = quantize_rows_ref(patches(x, 3, 3, 1, 1, 1, 1), fmt, 10.0)
    assert scale.dim() == 0 and scale.item() == pytest.approx(10.0 / FORMATS[fmt][2])
    assert torch.equal(q.view(torch.uint8), q_rows.view(torch.uint8)) and torch.equal(scale_rows, scale.expand(40))


def test_cpu_call_falls_back_to_the_reference():
    x = channels_last(1, 8, 4, 4, dtype=torch.float16)
    with config.override(log_fallbacks=False):
        dispatch.reset_stats()
        q, scale = im2col_quantize(x, "e4m3fn", 4.0, 3, 3, 1, 1, 1, 1)
    q_ref, scale_ref = im2col_quantize_ref(x, "e4m3fn", 4.0, 3, 3, 1, 1, 1, 1)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(scale, scale_ref)
    assert dispatch.stats()["im2col_quantize"] == {"torch": 1}


@pytest.mark.parametrize("args, message", [
    ((torch.zeros(2, 4, 3), "e4m3fn", 1.0, 3, 3), "is not .N, C, H, W."),
    ((torch.zeros(1, 4, 3, 3), "int8", 1.0, 3, 3), "is not an fp8 format"),
    ((torch.zeros(1, 4, 3, 3), "fp4", 1.0, 3, 3), "is not one of"),
    ((torch.zeros(1, 4, 3, 3), "e4m3fn", 0.0, 3, 3), "bound 0.0 is not a finite positive value"),
    ((torch.zeros(1, 4, 3, 3), "e4m3fn", float("inf"), 3, 3), "bound inf"),
    ((torch.zeros(1, 4, 3, 3), "e4m3fn", 1.0, 0, 3), "window is not 1 to 64 taps"),
    ((torch.zeros(1, 4, 3, 3), "e4m3fn", 1.0, 3, 3, 0, 1), "stride .0, 1. must be positive"),
    ((torch.zeros(1, 4, 3, 3), "e4m3fn", 1.0, 3, 3, 1, 1, 3, 1), "padding .3, 1. smaller than"),
    ((torch.zeros(1, 4, 2, 2), "e4m3fn", 1.0, 3, 3), "does not fit the input's 2x2 pixels"),
    ((torch.zeros(1, 4, 3, 3, dtype=torch.int32), "e4m3fn", 1.0, 3, 3), "not a floating-point type"),
])
def test_bad_arguments_are_clear_errors(args, message):
    with pytest.raises(RuntimeError, match=f"rocm_sd::im2col_quantize: .*{message}"):
        im2col_quantize(*args)


@pytest.mark.parametrize("x, expected", [
    (lambda: torch.zeros(1, 8, 4, 4), "not channels_last"),
    (lambda: torch.zeros(1, 8, 4, 4, dtype=torch.float64).contiguous(memory_format=torch.channels_last),
     "dtype torch.float64"),
    (lambda: torch.zeros(0, 8, 4, 4).contiguous(memory_format=torch.channels_last), "empty tensor"),
])
def test_unsupported_inputs_are_named(x, expected):
    assert any(expected in r for r in supports(x(), "e4m3fn", 1.0, 3, 3, 1, 1, 1, 1))


def test_group_norm_bound_holds_for_the_most_extreme_group():
    """A group whose every value but one is equal reaches sqrt(n - 1) after normalization (the bound's case); SiLU
    and the affine parameters keep the bound."""
    norm = nn.GroupNorm(2, 8)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(2, -1.5, 8))
        norm.bias.copy_(torch.linspace(-0.5, 0.7, 8))
    bound = group_norm_bound(norm)
    x = torch.zeros(1, 8, 4, 4)
    x[0, 0, 0, 0] = 1000.0  # one spike in group 0: |normalized| = sqrt(n - 1)
    x[0, 4:, 1, 2] = -50.0
    y = F.silu(norm(x))
    assert y.abs().max().item() <= bound.at(16)
    assert y.abs().max().item() >= bound.at(16) / 1.25 * 0.9  # and the bound is reached, up to its margin


def test_quantized_conv_is_the_product_of_the_quantized_operands_and_keeps_channels_last():
    conv = nn.Conv2d(32, 16, 3, padding=1)
    norm = nn.GroupNorm(4, 32)
    layer = RocmQuantizedConv2d(conv, "e4m3fn", group_norm_bound(norm))
    x = F.silu(norm(torch.randn(2, 32, 6, 5))).contiguous(memory_format=torch.channels_last)
    with config.override(log_fallbacks=False):
        out = layer(x)
        without_bias = layer.convolve(x, with_bias=False)
    q, scale = im2col_quantize_ref(x, "e4m3fn", layer.input_bound.at(30), 3, 3, 1, 1, 1, 1)
    weight = layer.weight_q.float() * layer.weight_scale
    expected = (q.float() * scale) @ weight.t()
    assert out.is_contiguous(memory_format=torch.channels_last) and out.shape == (2, 16, 6, 5)
    assert torch.allclose(without_bias.permute(0, 2, 3, 1).reshape(-1, 16), expected, atol=1e-4)
    assert torch.allclose(out - without_bias, conv.bias.detach().view(1, -1, 1, 1).expand_as(out), atol=1e-5)
    ref = conv(x)
    assert 0 < ((out - ref).norm() / ref.norm()).item() < 0.08  # FP8's rounding of both operands


def test_quantized_conv_refuses_what_the_gemm_cannot_compute():
    bound = GroupNormBound(8, 1.0, 0.0)
    with pytest.raises(ValueError, match="not one of e4m3fn, e4m3fnuz"):
        RocmQuantizedConv2d(nn.Conv2d(16, 16, 3, padding=1), "int8", bound)
    with pytest.raises(ValueError, match="zero-padded convolution of one group"):
        RocmQuantizedConv2d(nn.Conv2d(16, 16, 3, padding=1, groups=2), "e4m3fn", bound)
    layer = RocmQuantizedConv2d(nn.Conv2d(16, 16, 3, padding=1), "e4m3fn", bound)
    with pytest.raises(ValueError, match=r"input of shape \(1, 8, 4, 4\) is not \(N, 16, H, W\)"):
        layer(torch.zeros(1, 8, 4, 4))


# ------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_is_bit_exact(shape, dtype, fmt):
    """Against the definition, into poisoned outputs; the bound sits inside the values so that some saturate."""
    n, c, h, w, k, s, p = shape
    x = channels_last(n, c, h, w, dtype=dtype, device="cuda", scale=2.0)
    q, scale = im2col_quantize_kernel(x, fmt, 5.0, k, k, s, s, p, p)
    q_ref, scale_ref = im2col_quantize_ref(x, fmt, 5.0, k, k, s, s, p, p)
    assert torch.equal(scale, scale_ref)
    assert same_codes(q, q_ref)
    assert (q_ref.float().abs() == FORMATS[fmt][2]).any()  # saturation was exercised


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FP8)
def test_kernel_keeps_nan_and_infinities_as_the_definition(fmt):
    x = channels_last(1, 16, 4, 4, dtype=torch.float16, device="cuda")
    x[0, 3, 1, 2], x[0, 5, 2, 2], x[0, 7, 0, 0] = float("nan"), float("inf"), -float("inf")
    q, scale = im2col_quantize_kernel(x, fmt, 3.0, 3, 3, 1, 1, 1, 1)
    q_ref, _ = im2col_quantize_ref(x, fmt, 3.0, 3, 3, 1, 1, 1, 1)
    assert same_codes(q, q_ref) and q_ref.float().isnan().any()


@pytest.mark.gpu
def test_op_dispatches_to_the_kernel_in_strict_mode_and_in_a_graph():
    x = channels_last(2, 320, 16, 16, dtype=torch.float16, device="cuda")
    with config.override(strict=True):
        dispatch.reset_stats()
        q, scale = im2col_quantize.call(x, "e4m3fn", 8.0, 3, 3, 1, 1, 1, 1)
        assert dispatch.stats()["im2col_quantize"] == {"rocm_sd": 1}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            q2, scale2 = im2col_quantize.call(x, "e4m3fn", 8.0, 3, 3, 1, 1, 1, 1)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(scale, scale2)


@pytest.mark.gpu
@pytest.mark.parametrize("channels, out_channels, size", [(320, 320, 32), (640, 1280, 16), (1920, 640, 8)])
def test_fp8_convolution_on_the_gpu_matches_the_convolution(channels, out_channels, size):
    """The whole layer (the kernel, then the per-tensor FP8 GEMM with bias) against fp64, and against the product of
    its own quantized operands, which only the GEMM's accumulation order may move."""
    torch.manual_seed(0)
    conv = nn.Conv2d(channels, out_channels, 3, padding=1).cuda().half()
    norm = nn.GroupNorm(32, channels).cuda().half()
    layer = RocmQuantizedConv2d(conv, "e4m3fn", group_norm_bound(norm)).cuda()
    with torch.no_grad():  # a call that needs gradients takes the PyTorch path
        x = F.silu(norm(torch.randn(2, channels, size, size, device="cuda", dtype=torch.float16)))
        x = x.contiguous(memory_format=torch.channels_last)
        with config.override(strict=True):
            dispatch.reset_stats()
            out = layer(x)
        assert dispatch.stats()["im2col_quantize"] == {"rocm_sd": 1}
    truth = F.conv2d(x.double(), conv.weight.double(), conv.bias.double(), padding=1)
    error = ((out.double() - truth).norm() / truth.norm()).item()
    assert out.is_contiguous(memory_format=torch.channels_last) and math.isfinite(error) and error < 0.06
    q, scale = im2col_quantize_ref(x, "e4m3fn", layer.input_bound.at(size * size), 3, 3, 1, 1, 1, 1)
    product = (q.double() * scale.double()) @ (layer.weight_q.double() * layer.weight_scale.double()).t()
    product = (product + conv.bias.double()).view(2, size, size, out_channels).permute(0, 3, 1, 2)
    # NVIDIA's fast FP8 accumulation (modules/quantized_linear.FAST_ACCUMULATION) drifts with K = 9 C: 2.1e-3 at
    # K = 17280 on an H100, ten times below the operands' FP8 rounding.
    assert ((out.double() - product).norm() / product.norm()).item() < 5e-3
