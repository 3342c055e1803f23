import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.ops.layout_copy import describe, input_reasons, layout_copy_kernel, layout_copy_ref, supports

# (N, C, H, W): SD activations (UNet 64x64 / 8x8, the VAE's largest, latents, the decoded image), then awkward
# ones: vector widths 4, 2 and 1, 1x1 spatial, one channel, partial tiles on both axes.
LAYOUT_SHAPES = [(2, 320, 64, 64), (2, 1280, 8, 8), (1, 128, 512, 512), (2, 4, 64, 64), (1, 3, 512, 512),
                 (3, 12, 4, 4), (1, 6, 5, 6), (3, 5, 7, 9), (2, 8, 1, 1), (1, 1, 3, 3), (2, 72, 9, 40)]


def make(shape, dtype, device, channels_last):
    x = torch.randn(shape, device=device).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@pytest.mark.parametrize("to_channels_last", [True, False])
def test_reference_copies_into_the_other_layout(to_channels_last):
    x = make((2, 6, 3, 5), torch.float32, "cpu", channels_last=not to_channels_last)
    y = layout_copy_ref(x, to_channels_last)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    assert y.is_contiguous(memory_format=torch.channels_last if to_channels_last else torch.contiguous_format)


def test_unsupported_arguments_are_named_and_fall_back():
    x = make((2, 8, 4, 4), torch.float16, "cpu", channels_last=False)
    assert any("not dense channels_last" in r for r in input_reasons(x, False))  # already NCHW
    assert any("not dense NCHW" in r for r in input_reasons(x[..., ::2], True))
    assert any("dtype torch.float64" in r for r in input_reasons(x.double(), True))
    assert any("3-D" in r for r in input_reasons(x[0], True))
    assert any("empty" in r for r in input_reasons(x[:0], True))
    with config.override(log_fallbacks=False):
        for to_channels_last in (True, False):
            y = torch.ops.rocm_sd.layout_copy(x, to_channels_last)  # CPU: the PyTorch path, right either way
            assert torch.equal(y, x) and y.is_contiguous(
                memory_format=torch.channels_last if to_channels_last else torch.contiguous_format)
    assert dispatch.stats()["layout_copy"] == {"torch": 2}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", LAYOUT_SHAPES, ids=str)
@pytest.mark.parametrize("to_channels_last", [True, False], ids=["to_nhwc", "to_nchw"])
def test_kernel_copies_exactly(shape, dtype, to_channels_last):
    x = make(shape, dtype, "cuda", channels_last=not to_channels_last)
    assert not supports(x, to_channels_last), supports(x, to_channels_last)
    out = torch.empty(shape, device="cuda", dtype=dtype,
                      memory_format=torch.channels_last if to_channels_last else torch.contiguous_format)
    out.fill_(float("nan"))  # poisoned: every element must be written
    y = layout_copy_kernel(x, to_channels_last, out=out)
    assert torch.equal(y, x), f"{shape} {dtype} {describe(x, to_channels_last)}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_misaligned_tensor_takes_the_register_kernel(dtype):
    base = torch.randn(1 + 2 * 64 * 8 * 8, device="cuda").to(dtype)
    x = base[1:].view(2, 64, 8, 8)  # sizes of whole 64 x 64 tiles, but not 16-byte aligned
    assert "tile" not in describe(x, True), describe(x, True)
    assert torch.equal(layout_copy_kernel(x, True), x)


@pytest.mark.gpu
def test_vector_width_follows_the_sizes_and_the_op_runs_the_kernel():
    assert describe(make((2, 320, 64, 64), torch.float16, "cuda", False), True) == "vec=8 tile=64x64 blocks=640"
    assert describe(make((2, 320, 60, 60), torch.float16, "cuda", False), True) == "vec=8 blocks=150"  # not tiles of 64
    assert describe(make((2, 320, 64, 64), torch.float32, "cuda", False), True).startswith("vec=4 ")
    assert describe(make((3, 12, 4, 4), torch.float16, "cuda", False), True).startswith("vec=4 ")
    assert describe(make((1, 6, 5, 6), torch.float16, "cuda", True), False).startswith("vec=2 ")
    assert describe(make((1, 3, 512, 512), torch.float16, "cuda", False), True).startswith("vec=1 ")
    x = make((2, 320, 64, 64), torch.float16, "cuda", False)
    with config.override(strict=True):
        y = torch.ops.rocm_sd.layout_copy(x, True)
        back = torch.ops.rocm_sd.layout_copy(y, False)
    assert dispatch.stats()["layout_copy"] == {"rocm_sd": 2}
    assert torch.equal(y, x) and y.is_contiguous(memory_format=torch.channels_last) and torch.equal(back, x)


@pytest.mark.gpu
def test_untuned_narrow_or_tiny_copies_take_pytorch_as_a_policy():
    # A decoded image (C = 3: 2-byte vectors at best) and a grid of 10 blocks: PyTorch's copy was faster.
    image = make((1, 3, 512, 512), torch.float16, "cuda", False)
    small = make((2, 1280, 4, 4), torch.float16, "cuda", True)
    with config.override(strict=True):  # a policy, not a fallback: no error
        assert torch.equal(torch.ops.rocm_sd.layout_copy(image, True), image)
        assert torch.equal(torch.ops.rocm_sd.layout_copy(small, False), small)
    assert dispatch.stats()["layout_copy"] == {"torch": 2}
    with dispatch.force_backend("layout_copy", "rocm_sd"):  # the kernel still takes them when asked
        assert torch.equal(torch.ops.rocm_sd.layout_copy(image, True), image)
    assert dispatch.stats()["layout_copy"] == {"torch": 2, "rocm_sd": 1}


@pytest.mark.gpu
def test_nan_and_inf_are_copied_as_they_are():
    x = make((1, 16, 8, 8), torch.float16, "cuda", False)
    x[0, 3, 2, 5], x[0, 7, 0, 0] = float("nan"), float("-inf")
    y = layout_copy_kernel(x, True)
    assert torch.isnan(y[0, 3, 2, 5]) and y[0, 7, 0, 0] == float("-inf") and torch.isnan(y).sum() == 1
