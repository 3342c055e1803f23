"""fold_upsample: Upsample2D's nearest 2x + 3x3 convolution as one folded 2x2 convolution and a pixel shuffle."""
import pytest
import torch
from diffusers.models.upsampling import Upsample2D

from rocm_sd.ops._common import within_tolerance
from rocm_sd.patch.core import PatchRecord
from rocm_sd.modules.upsample import fold_weight
from rocm_sd.patch.diffusers import patch_upsamplers


def make(channels=16, out_channels=8, bias=True, channels_last=False, shape=(2, 5, 7)):
    module = Upsample2D(channels, use_conv=True, out_channels=out_channels, bias=bias)
    x = torch.randn(shape[0], channels, *shape[1:])
    if channels_last:
        module, x = module.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    return module, x


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_folded_upsample_equals_diffusers_and_keeps_the_layout(channels_last, bias):
    module, x = make(bias=bias, channels_last=channels_last)
    with torch.no_grad():
        reference = module(x)
        record = PatchRecord()
        patch_upsamplers(module, record)
        assert record.counts["upsample+conv folded"] == 1
        out = module(x)
        assert out.shape == reference.shape == (2, 8, 10, 14)
        assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(module(x, output_size=(10, 14)), reference, rtol=1e-5, atol=1e-5)
        record.revert()
        assert torch.equal(module(x), reference)


def test_fold_weight_on_a_constant_image_is_the_kernel_sum():
    # Every parity of a constant input sees all nine taps (away from the border).
    weight = torch.randn(3, 2, 3, 3)
    folded = fold_weight(weight)
    assert folded.shape == (12, 2, 2, 2)
    for block in range(4):
        torch.testing.assert_close(folded[3 * block:3 * (block + 1)].sum((2, 3)), weight.sum((2, 3)))


def test_weights_changed_in_place_are_refolded_and_other_calls_run_diffusers():
    module, x = make()
    record = PatchRecord()
    patch_upsamplers(module, record)
    with torch.no_grad():
        module(x)
        module.conv.weight.mul_(2)  # e.g. a LoRA fused into the weights
        out = module(x)
        record.revert()
        reference = module(x)
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
        patch_upsamplers(module, PatchRecord())
        # An output size other than 2x (the UNet's odd latent sizes) takes diffusers' own path: exact.
        assert torch.equal(module(x, output_size=(11, 15)), type(module).forward(module, x, output_size=(11, 15)))
    # Autograd takes diffusers' path too (the folded weights are not differentiable parameters).
    y = module(x.requires_grad_())
    y.sum().backward()
    assert x.grad is not None


def test_torch_compile_traces_the_hosts_own_forward():
    module, x = make()
    patch_upsamplers(module, PatchRecord())
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), type(module).forward(module, x))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_folded_upsample_on_gpu_at_a_vae_shape(dtype):
    module, x = make(channels=128, out_channels=128, channels_last=True, shape=(1, 64, 48))
    module, x = module.to("cuda", dtype), x.to("cuda", dtype)
    with torch.no_grad():
        truth = type(module).forward(module.double(), x.double())
        module = module.to(dtype)
        reference = type(module).forward(module, x)
        patch_upsamplers(module, PatchRecord())
        out = module(x)
    assert out.is_contiguous(memory_format=torch.channels_last)
    # The folded kernel adds taps before rounding: the shared rule, at most twice diffusers' own error.
    ok, err, allowed = within_tolerance(out, truth, reference)
    assert ok, (err, allowed)


@pytest.mark.parametrize("mode", ["circular", "reflect", "replicate"])
def test_a_padding_mode_set_after_patching_takes_the_hosts_own_path(mode):
    """The webui's tiling and ComfyUI's seamless-tiling nodes set padding_mode on every Conv2d after the model is
    patched; the folded kernels assume zeros outside the image, so such calls run the host's convolution (diffusers'
    Upsample2D under optimize(), a host's Upsample through its kernel-backed copy), and zero padding folds again."""
    from rocm_sd.modules.host_copies import upsample_copy
    from tests.test_a1111 import _Upsample  # a host's own VAE Upsample (ldm's, ComfyUI's): nearest 2x, 3x3 conv

    module, x = make()
    patch_upsamplers(module, PatchRecord())
    host = _Upsample(16)
    copy = upsample_copy(host)
    y = torch.randn(2, 16, 5, 7)
    with torch.no_grad():
        for conv in (module.conv, host.conv):
            conv.padding_mode = mode
        assert torch.equal(module(x), type(module).forward(module, x))
        assert torch.equal(copy(y), host(y))
        for conv in (module.conv, host.conv):
            conv.padding_mode = "zeros"
        torch.testing.assert_close(copy(y), host(y), rtol=1e-5, atol=1e-5)
        assert copy.rocm_sd_folded  # the folded kernels ran
