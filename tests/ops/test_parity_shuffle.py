import pytest
import torch
import torch.nn.functional as F

from rocm_sd import config
from rocm_sd.ops.parity_shuffle import input_reasons, parity_shuffle_kernel, parity_shuffle_ref, supports

# (N, C, H, W): the output channels and the input resolution of an upsampler (UNet, VAE, awkward).
PARITY_SHAPES = [(2, 1280, 8, 8), (2, 640, 32, 32), (1, 512, 64, 64), (1, 256, 128, 128), (3, 12, 5, 7), (1, 3, 4, 4)]


def make(shape, dtype, device, bias=True):
    n, c, h, w = shape
    parities = torch.randn(n, 4 * c, h + 1, w + 1, device=device).to(dtype).contiguous(memory_format=torch.channels_last)
    return parities, (torch.randn(c, device=device).to(dtype) if bias else None)


def test_reference_is_the_upsampled_convolution():
    # The definition end to end: the folded parities of a 3x3 convolution, shuffled, are conv(nearest_2x(x)).
    from rocm_sd.modules.upsample import fold_weight

    x = torch.randn(2, 6, 5, 7).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(4, 6, 3, 3), torch.randn(4)
    parities = F.conv2d(x, fold_weight(weight).contiguous(memory_format=torch.channels_last), None, padding=1)
    expected = F.conv2d(F.interpolate(x, scale_factor=2.0, mode="nearest"), weight, bias, padding=1)
    torch.testing.assert_close(parity_shuffle_ref(parities, bias), expected, rtol=1e-5, atol=1e-5)


def test_unsupported_arguments_are_named():
    parities, bias = make((1, 8, 4, 4), torch.float16, "cpu")
    assert any("channels_last" in r for r in input_reasons(parities.contiguous(), bias))
    assert any("(N, 4C, H + 1, W + 1)" in r for r in input_reasons(parities[:, :30], None))
    assert any("bias" in r for r in input_reasons(parities, bias.float()))
    assert any("dtype torch.float64" in r for r in input_reasons(parities.double(), None))
    with config.override(log_fallbacks=False):
        assert torch.equal(torch.ops.rocm_sd.parity_shuffle(parities, bias), parity_shuffle_ref(parities, bias))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", PARITY_SHAPES, ids=str)
def test_kernel_equals_reference(shape, dtype):
    # A copy plus one add rounded once, in the kernel and in the reference: equal bit for bit.
    for bias_on in (True, False):
        parities, bias = make(shape, dtype, "cuda", bias_on)
        assert not supports(parities, bias), supports(parities, bias)
        poisoned = torch.full_like(parity_shuffle_ref(parities, bias), float("nan"))
        out = parity_shuffle_kernel(parities, bias, out=poisoned)
        assert out.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(out, parity_shuffle_ref(parities, bias)), (shape, dtype, bias_on)
