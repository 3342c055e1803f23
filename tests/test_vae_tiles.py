"""optimize(vae_tiles=True): AutoencoderKL's decode in tiles of fixed shapes (rocm_sd/modules/vae_tiles.py). The tiles
are scaled down (sides of 8, 12 and 16 latents instead of 64, 96 and 128) to decode a toy VAE in milliseconds; the
plan is the same function of the sides."""
from __future__ import annotations

import math

import pytest
import torch

import rocm_sd
from rocm_sd import models, platform
from rocm_sd.dit_models import FLUX_VAE, TINY_VAE16
from rocm_sd.modules import vae_tiles
from rocm_sd.patch.pipeline import FLAGS
from rocm_sd.prepare import VendorProblems

SIZES, OVERLAP = (8, 12, 16), 2
# Twelve latent sizes, square and not, from one tile to several per side.
RESOLUTIONS = [(8, 8), (8, 12), (12, 8), (10, 10), (13, 19), (16, 16), (14, 18), (19, 13), (20, 20), (24, 16),
               (24, 24), (9, 23)]


def _vae(**config):
    from diffusers import AutoencoderKL

    return AutoencoderKL(**{**models.TINY_VAE, "block_out_channels": (8, 16), "norm_num_groups": 4,
                            "sample_size": 32, **config}).eval()


def _psnr(image, reference) -> float:
    mse = ((image.float() - reference.float()) / 2).pow(2).mean().item()  # images in [-1, 1]
    return 10 * math.log10(1 / mse) if mse else float("inf")


def _tiled(vae, z, sizes=SIZES, overlap=OVERLAP):
    return vae_tiles.tiled_decode(vae, z, sizes=sizes, min_overlap=overlap).sample


@pytest.mark.parametrize("length", [8, 9, 12, 17, 23, 24, 40, 61, 127])
def test_tiles_cover_an_axis_flush_with_its_edges(length):
    side, starts = vae_tiles.axis_tiles(length, SIZES, OVERLAP)
    assert side in SIZES and starts[0] == 0 and starts == sorted(set(starts))
    assert starts[-1] + side == length  # no tile reaches past the edge: none is padded
    assert all(b - a <= side - OVERLAP for a, b in zip(starts, starts[1:]))  # neighbours overlap by OVERLAP or more


@pytest.mark.parametrize("length", [17, 23, 40, 61])
def test_neighbours_cross_fade_linearly_over_their_overlap(length):
    side, starts = vae_tiles.axis_tiles(length, SIZES, OVERLAP)
    scale, total = 2, torch.zeros(length * 2)
    ramps = vae_tiles._ramps(starts, side, scale, "cpu")
    for start, ramp in zip(starts, ramps):
        total[start * scale:(start + side) * scale] += ramp
    torch.testing.assert_close(total, torch.ones_like(total))  # the weights of the tiles over a pixel sum to one
    for (a, ramp_a), (b, ramp_b) in zip(zip(starts, ramps), zip(starts[1:], ramps[1:])):
        overlap = (a + side - b) * scale
        steps = ramp_b[:overlap].diff()
        torch.testing.assert_close(steps, torch.full_like(steps, 1 / overlap))  # linear, from the cut inwards


class _Upscaler(torch.nn.Module):
    """A 'VAE' whose decoder is a position-wise map (no receptive field, no statistics): tiles change nothing."""
    post_quant_conv = None

    def decoder(self, z):
        return torch.nn.functional.interpolate(z[:, :3], scale_factor=4).sin()


@pytest.mark.parametrize("height, width", [(8, 8), (9, 23), (24, 17), (31, 45)])
def test_the_blend_of_a_decoder_without_context_is_the_untiled_image(height, width):
    """Every output pixel covered, each tile put back where it was cut, the weights normalised."""
    z = torch.randn(2, 4, height, width)
    torch.testing.assert_close(_tiled(_Upscaler(), z), _Upscaler().decoder(z), rtol=1e-6, atol=1e-6)


def test_no_resolution_brings_a_convolution_problem_the_tile_shapes_did_not():
    vae, prepared, tiled = _vae(), VendorProblems(), VendorProblems()
    with torch.no_grad():
        with prepared:  # what `prepare` runs for the VAE: every tile shape once
            for height in SIZES:
                for width in SIZES:
                    _tiled(vae, torch.randn(1, 4, height, width))
        sizes_bringing_new = set()
        for height, width in RESOLUTIONS:
            z = torch.randn(1, 4, height, width)
            with tiled:
                _tiled(vae, z)
            with (untiled := VendorProblems()):
                vae.decode(z)
            if set(untiled.problems) - set(prepared.problems):
                sizes_bringing_new.add((height, width))
    assert tiled.count("convolution") > 0 and set(tiled.problems) <= set(prepared.problems)
    # untiled, every size that is not a tile shape brings new ones
    assert sizes_bringing_new == {(h, w) for h, w in RESOLUTIONS if h not in SIZES or w not in SIZES}
    shapes = set().union(*(vae_tiles.tile_shapes(h, w, SIZES, OVERLAP) for h, w in RESOLUTIONS))
    assert shapes <= {(h, w) for h in SIZES for w in SIZES}


def test_a_latent_of_one_tile_decodes_as_the_untiled_decode():
    vae, z = _vae(), torch.randn(1, 4, 12, 16)
    with torch.no_grad():
        assert torch.equal(_tiled(vae, z), vae.decode(z).sample)


def test_a_latent_narrower_than_the_smallest_tile_is_decoded_as_it_is():
    vae, z = _vae(), torch.randn(2, 4, 6, 20)
    with torch.no_grad():
        assert torch.equal(_tiled(vae, z), vae.decode(z).sample)


def test_a_batch_decodes_image_by_image():
    vae, z = _vae(), torch.randn(2, 4, 14, 21)
    with torch.no_grad():
        batch = _tiled(vae, z)
        assert batch.shape == (2, 3, 28, 42)
        torch.testing.assert_close(batch, torch.cat([_tiled(vae, image) for image in z.split(1)]))


@pytest.mark.parametrize("height, width", [(20, 28), (9, 30)])
def test_seams_are_no_worse_than_diffusers_tiled_decode(height, width):
    """Against the untiled decode, with tiles of one side as diffusers' tiled_decode has them (its 25% overlap):
    diffusers' last row and column of tiles shrink; here every tile keeps its shape."""
    vae = _vae(block_out_channels=(32, 64), norm_num_groups=8)
    vae.tile_latent_min_size, vae.tile_sample_min_size = 8, 16
    z = torch.randn(1, 4, height, width)
    with torch.no_grad():
        reference = vae.decode(z).sample
        ours = _tiled(vae, z, sizes=(8,), overlap=2)
        theirs = vae.tiled_decode(z).sample
    assert ours.shape == reference.shape and torch.isfinite(ours).all()
    assert _psnr(ours, reference) >= _psnr(theirs, reference), (_psnr(ours, reference), _psnr(theirs, reference))


def test_optimize_tiles_the_decode_and_revert_restores_it():
    vae, z = _vae(), torch.randn(1, 4, 70, 64)  # tiles of 64 latents: two along 70
    with torch.no_grad():
        reference = vae.decode(z).sample
        rocm_sd.optimize(vae, vae_tiles=True, cuda_graph=False)
        assert "decode in fixed-shape tiles" in rocm_sd.report(vae)["AutoencoderKL"]
        tiled = vae.decode(z).sample
        assert torch.equal(tiled, vae_tiles.tiled_decode(vae, z).sample)
        rocm_sd.revert(vae)
        assert "_decode" not in vae.__dict__
        assert torch.equal(vae.decode(z).sample, reference)
    assert tiled.shape == reference.shape


def test_vae_tiles_is_off_by_default_off_rocm(monkeypatch):
    monkeypatch.setattr(platform, "torch_gpu_platform", lambda: "cuda")
    vae = _vae()
    rocm_sd.optimize(vae, cuda_graph=False)
    assert "decode in fixed-shape tiles" not in rocm_sd.report(vae)["AutoencoderKL"]
    assert "_decode" not in vae.__dict__
    rocm_sd.revert(vae)


def test_the_16_channel_vae_of_sd3_and_flux_decodes_in_tiles():
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(**{**TINY_VAE16, **FLUX_VAE, "sample_size": 32}).eval()
    assert vae.post_quant_conv is None
    z = torch.randn(1, 16, 10, 19)
    with torch.no_grad():
        reference, tiled = vae.decode(z).sample, _tiled(vae, z)
    assert tiled.shape == reference.shape and _psnr(tiled, reference) > 15


@pytest.mark.parametrize("gpu_platform, on", [("hip", True), ("cuda", False), ("none", False)])
def test_vae_tiles_is_on_by_default_with_rocm_only(monkeypatch, gpu_platform, on):
    monkeypatch.setattr(platform, "torch_gpu_platform", lambda: gpu_platform)
    [flag] = [flag for flag in FLAGS if flag.name == "vae_tiles"]
    assert flag.value({}, {}) is on and flag.value({"vae_tiles": None}, {}) is on
    assert flag.value({"vae_tiles": not on}, {}) is (not on)
    assert flag.default_text() == "off (on with ROCm's torch)"


@pytest.mark.gpu
def test_graphed_tiled_decode_on_gpu_replays_the_eager_tiles():
    """With the kernels and graphs of optimize()'s defaults: a batch of two, two tiles along one side."""
    vae = _vae(block_out_channels=(32, 64), norm_num_groups=8).to("cuda", torch.float16)
    z = torch.randn(2, 4, 70, 64, device="cuda", dtype=torch.float16)
    rocm_sd.optimize(vae, vae_tiles=True)
    try:
        with torch.no_grad():
            first, replayed = vae.decode(z).sample, vae.decode(z).sample
            eager = vae_tiles.tiled_decode(vae, z).sample
        assert rocm_sd.report(vae)["AutoencoderKL"]["decode: graph replays"] >= 1
        assert torch.isfinite(replayed).all() and replayed.shape == (2, 3, 140, 128)
        torch.testing.assert_close(first, eager, rtol=0, atol=0)
        torch.testing.assert_close(replayed, eager, rtol=0, atol=0)
    finally:
        rocm_sd.revert(vae)
