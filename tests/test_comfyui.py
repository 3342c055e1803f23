"""The ComfyUI node package (integrations/comfyui) against the stand-in of ComfyUI's interfaces in
tests/standins (ComfyUI is not on PyPI; see that folder's README). The node must also be tried in a real
ComfyUI checkout (docs/comfyui.md)."""
from __future__ import annotations

import contextlib
import sys

import pytest
import torch

import rocm_sd
from rocm_sd import config, dispatch
from rocm_sd.patch import comfy as comfy_patch

from tests.comfyui_standin import load_node_package, model_inputs, run_model, run_patched_with_stats, standin_model


def test_node_contract(nodes):
    assert set(nodes.NODE_CLASS_MAPPINGS) == {"RocmSDOptimizeModel", "RocmSDOptimizeVAE", "RocmSDTune"}
    assert nodes.NODE_DISPLAY_NAME_MAPPINGS["RocmSDOptimizeModel"] == "rocm_sd Optimize Model"
    assert set(nodes.NODE_DISPLAY_NAME_MAPPINGS) == set(nodes.NODE_CLASS_MAPPINGS)
    for cls, socket in ((nodes.RocmSDOptimizeModel, "MODEL"), (nodes.RocmSDOptimizeVAE, "VAE")):
        required = cls.INPUT_TYPES()["required"]
        assert required[socket.lower()] == (socket,) and cls.RETURN_TYPES == (socket,)
        assert callable(getattr(cls, cls.FUNCTION)) and cls.CATEGORY == "rocm_sd"
        for name, spec in required.items():
            if name != socket.lower():
                assert spec[0] == "BOOLEAN" and spec[1]["default"] is True
    # ComfyUI restores a saved workflow's widget values by position: inputs keep their places, new ones go last
    assert list(nodes.RocmSDOptimizeModel.INPUT_TYPES()["required"]) == [
        "model", "attention", "group_norm", "layer_norm", "channels_last", "cuda_graph"]
    assert list(nodes.RocmSDOptimizeModel.INPUT_TYPES()["optional"]) == [
        "cache", "cache_interval", "cache_threshold", "precision", "cache_branch", "precision_layers",
        "attention_precision", "dit_cache_threshold"]


def test_clone_not_mutate_and_same_output(comfy, nodes):
    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    reference = run_model(patcher, x, ctx)
    originals = dict(patcher.model.named_modules())
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    assert optimized is not patcher and optimized.model is patcher.model
    assert patcher.object_patches == {} and patcher.model_options == {"transformer_options": {}}
    assert dict(patcher.model.named_modules()) == originals  # nothing is swapped until ComfyUI loads the clone
    assert "optimized_attention_override" in optimized.model_options["transformer_options"]

    optimized.patch_model()
    try:
        res = optimized.model.diffusion_model.input_blocks[1][0]
        assert type(res.in_layers[0]).__name__ == "RocmGroupNorm" and isinstance(res.in_layers[1], torch.nn.Identity)
        assert type(optimized.model.diffusion_model.out[0]).__name__ == "RocmGroupNorm"
        norm = optimized.model.diffusion_model.input_blocks[1][1].transformer_blocks[0].norm1
        assert type(norm).__name__ == "RocmLayerNorm"
        assert norm.weight is originals["diffusion_model.input_blocks.1.1.transformer_blocks.0.norm1"].weight
        got = run_model(optimized, x, ctx)
    finally:
        optimized.unpatch_model()
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
    assert dict(patcher.model.named_modules()) == originals
    assert torch.equal(run_model(patcher, x, ctx), reference)


def test_options_turn_pieces_off(comfy, nodes):
    patcher = standin_model(comfy)
    (only_attention,) = nodes.RocmSDOptimizeModel().optimize(patcher, attention=True, group_norm=False, layer_norm=False,
                                                             channels_last=False)
    assert only_attention.object_patches == {}
    (only_norms,) = nodes.RocmSDOptimizeModel().optimize(patcher, attention=False)
    assert "optimized_attention_override" not in only_norms.model_options["transformer_options"]
    assert any(k.endswith("in_layers.0") for k in only_norms.object_patches)


def test_channels_last_runs_every_convolution_nhwc_on_the_hosts_own_weights(comfy, nodes):
    """The channels_last option: every Conv2d of the UNet swapped for a copy sharing its Parameters that runs on a
    channels_last view of the weight, so the activations between the layers are NHWC; the result is ComfyUI's;
    ComfyUI's own weight patching (LoRA: a new Parameter set through the object-patched path) still takes effect."""
    import comfy.utils as comfy_utils

    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    reference = run_model(patcher, x, ctx)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False)
    convs = {k: m for k, m in optimized.object_patches.items() if isinstance(m, torch.nn.Conv2d)}
    unet = patcher.model.diffusion_model
    assert len(convs) == sum(isinstance(m, torch.nn.Conv2d) for m in unet.modules()) > 0
    first = "diffusion_model.input_blocks.0.0"
    assert convs[first].weight is comfy_utils.get_attr(patcher.model, first + ".weight")  # shared, not copied
    seen = []
    optimized.patch_model()
    try:
        handle = comfy_utils.get_attr(optimized.model, "diffusion_model.input_blocks.1.0.in_layers.2") \
            .register_forward_hook(lambda m, i, out: seen.append(out.is_contiguous(memory_format=torch.channels_last)))
        torch.testing.assert_close(run_model(optimized, x, ctx), reference, rtol=1e-4, atol=1e-4)
        handle.remove()
        assert seen == [True]
        lora = comfy_utils.get_attr(optimized.model, first + ".weight").detach() * 0
        comfy_utils.set_attr(optimized.model, first + ".weight", torch.nn.Parameter(lora, requires_grad=False))
        assert not torch.allclose(run_model(optimized, x, ctx), reference)  # the patched weight is what runs
    finally:
        optimized.unpatch_model()


def test_scale_shift_resblocks_keep_their_silu_after_the_shift(comfy, nodes):
    patcher = standin_model(comfy, use_scale_shift_norm=True)
    x, ctx = model_inputs()
    reference = run_model(patcher, x, ctx)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    assert not any(k.endswith("out_layers.1") for k in optimized.object_patches)
    assert any(k.endswith("in_layers.1") for k in optimized.object_patches)
    optimized.patch_model()
    try:
        torch.testing.assert_close(run_model(optimized, x, ctx), reference, rtol=1e-5, atol=1e-5)
    finally:
        optimized.unpatch_model()


def test_low_vram_casting_takes_comfyuis_own_path(comfy, nodes):
    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    reference = run_model(patcher, x, ctx)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    optimized.patch_model()
    try:
        for module in optimized.model.modules():
            if type(module).__name__.startswith("Rocm"):
                module.comfy_cast_weights = True  # what ComfyUI sets on modules it streams in low-VRAM mode
                module.weight_function = [lambda w: w * 1.0]
        torch.testing.assert_close(run_model(optimized, x, ctx), reference, rtol=1e-5, atol=1e-5)
    finally:
        optimized.unpatch_model()


def test_older_comfyui_gets_attention_replace_patches(comfy, nodes, monkeypatch):
    monkeypatch.delattr(comfy["attention"], "wrap_attn")
    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    reference = run_model(patcher, x, ctx)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher, group_norm=False, layer_norm=False)
    replaces = optimized.model_options["transformer_options"]["patches_replace"]
    expected = {("input", 1, 0), ("middle", 0, 0), ("middle", 0, 1), ("output", 0, 0)}
    assert set(replaces["attn1"]) == expected and set(replaces["attn2"]) == expected
    calls = []
    for key in expected:  # count the calls, through the patch the node installed
        replaces["attn1"][key] = lambda q, k, v, extra, _f=replaces["attn1"][key]: calls.append(1) or _f(q, k, v, extra)
    torch.testing.assert_close(run_model(optimized, x, ctx), reference, rtol=1e-5, atol=1e-5)
    assert len(calls) == 4


MASKS = ["none", "2d-additive", "3d-bool", "4d-additive"]


def _mask(kind, b, heads, lq, lk, device):
    g = torch.Generator(device).manual_seed(3)
    if kind == "2d-additive":
        return torch.randn(lq, lk, device=device, generator=g)
    if kind == "3d-bool":
        m = torch.rand(b, lq, lk, device=device, generator=g) > 0.3
        m[..., 0] = True  # no fully masked row
        return m
    if kind == "4d-additive":
        return torch.randn(b, heads, lq, lk, device=device, generator=g)
    return None


@pytest.mark.parametrize("device,dtype,kernel", [
    ("cpu", torch.float32, False),
    pytest.param("cuda", torch.float16, False, marks=pytest.mark.gpu),
    pytest.param("cuda", torch.float16, True, marks=pytest.mark.gpu),
    pytest.param("cuda", torch.bfloat16, True, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("skip_reshape,skip_output_reshape", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("mask_kind", MASKS)
def test_attention_override_equals_comfyuis_attention(comfy, nodes, device, dtype, kernel, skip_reshape,
                                                      skip_output_reshape, mask_kind):
    # kernel: rocm_sd's attention kernel asked for by name (as a tuned choice would make it run); without it,
    # and for masked calls, the override hands the call to ComfyUI's own function.
    b, heads, lq, lk, d = 2, 8, 77 if mask_kind == "none" else 64, 77, 40
    g = torch.Generator(device).manual_seed(2)
    if skip_reshape:
        q, k, v = (torch.randn(b, heads, n, d, device=device, dtype=dtype, generator=g) for n in (lq, lk, lk))
    else:
        q, k, v = (torch.randn(b, n, heads * d, device=device, dtype=dtype, generator=g) for n in (lq, lk, lk))
    mask = _mask(mask_kind, b, heads, lq, lk, device)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    attention_pytorch = comfy["attention"].attention_pytorch
    kwargs = dict(mask=mask, skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape)
    expected = attention_pytorch(q, k, v, heads, **kwargs, transformer_options={})
    calls = []

    handed_back = []

    def spy(original, *args, **kw):
        calls.append(1)

        def comfys_own(*a, **k):
            handed_back.append(1)
            return original(*a, **k)
        return comfy_patch.attention_override(comfys_own, *args, **kw)

    with contextlib.ExitStack() as stack:
        if kernel:
            stack.enter_context(config.override(strict=True))
            stack.enter_context(dispatch.force_backend("attention", dispatch.KERNEL))
        rocm_sd.reset_stats()
        got = attention_pytorch(q, k, v, heads, **kwargs, transformer_options={"optimized_attention_override": spy})
        stats = rocm_sd.stats()
    assert calls == [1] and got.shape == expected.shape
    ours = kernel and mask is None
    assert handed_back == ([] if ours else [1])
    assert stats.get("attention", {}) == ({"rocm_sd": 1} if ours else {})
    truth = attention_pytorch(q.double(), k.double(), v.double(), heads, transformer_options={},
                              mask=mask if mask is None or mask.dtype == torch.bool else mask.double(),
                              skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape)
    torch_error = (expected.double() - truth).abs().max().item()
    assert (got.double() - truth).abs().max().item() <= 2 * torch_error + (1e-6 if dtype == torch.float32 else 2e-3)


def test_override_hands_unknown_arguments_back_to_comfyui():
    seen = []

    def original(*args, **kwargs):
        seen.append(kwargs)
        return "comfy's own"

    q = torch.randn(1, 4, 16)
    assert comfy_patch.attention_override(original, q, q, q, 2, enable_gqa=True) == "comfy's own"
    assert seen[0]["enable_gqa"] is True


def test_vae_node(comfy, nodes):
    vae = comfy["VAE"]()
    for p in vae.first_stage_model.parameters():
        p.data.normal_(0, 0.2)
    z = torch.randn(1, 4, 8, 8)
    with torch.inference_mode():
        reference = vae.decode(z)
    (optimized,) = nodes.RocmSDOptimizeVAE().optimize(vae)
    assert optimized is not vae and vae.patcher.object_patches == {}
    assert "decoder.mid.attn_1.optimized_attention" in optimized.patcher.object_patches
    assert "decoder.norm_out" in optimized.patcher.object_patches
    # The resnet blocks' GroupNorm and the SiLU after it run as one call: norms with SiLU, swish gone.
    patches = optimized.patcher.object_patches
    for block in ("decoder.mid.block_1", "decoder.mid.block_2"):
        assert patches[f"{block}.norm1"].rocm_sd_act == "silu" and patches[f"{block}.norm2"].rocm_sd_act == "silu"
        assert isinstance(patches[f"{block}.swish"], torch.nn.Identity)
    # The upsampler runs the folded 2x2 convolution, sharing the original's convolution (weight patches).
    assert patches["decoder.up.0.upsample"].conv is vae.first_stage_model.decoder.up[0].upsample.conv
    with torch.inference_mode():
        torch.testing.assert_close(optimized.decode(z), reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(vae.decode(z), reference)  # the original still decodes as before


def test_vae_upsampler_folded_and_host_casts_take_comfy_path(comfy, nodes):
    from comfy.ldm.modules.diffusionmodules.model import Upsample

    module = Upsample(8, with_conv=True)
    x = torch.randn(2, 8, 5, 6)
    (folded,) = comfy_patch.upsample_swaps(module).values()
    with torch.inference_mode():
        reference = module(x)
        torch.testing.assert_close(folded(x), reference, rtol=1e-5, atol=1e-5)
        assert folded.rocm_sd_folded  # the folded kernels were made and cached
        module.conv.comfy_cast_weights = True  # low-VRAM mode: ComfyUI casts the weights per call
        assert torch.equal(folded(x), module(x))
    assert comfy_patch.upsample_swaps(Upsample(8, with_conv=False)) == {}
    vae = comfy["VAE"]()
    (optimized,) = nodes.RocmSDOptimizeVAE().optimize(vae, fold_upsample=False)
    assert "decoder.up.0.upsample" not in optimized.patcher.object_patches
    assert "decoder.up.0.upsample.conv" in optimized.patcher.object_patches  # not folded: its conv goes NHWC
    (folded_vae,) = nodes.RocmSDOptimizeVAE().optimize(vae)
    patches = folded_vae.patcher.object_patches
    assert "decoder.up.0.upsample" in patches and "decoder.up.0.upsample.conv" not in patches  # the fold owns it
    assert "decoder.conv_in" in patches


def test_resnet_blocks_with_a_time_embedding_keep_their_own_silu(comfy):
    # swish also activates the time embedding there: only the norms are swapped, each without SiLU.
    from comfy.ldm.modules.diffusionmodules.model import ResnetBlock

    swaps = comfy_patch.norm_swaps(ResnetBlock(32, temb_channels=8))
    assert set(swaps) == {"norm1", "norm2"} and all(m.rocm_sd_act is None for m in swaps.values())
    assert set(comfy_patch.norm_swaps(ResnetBlock(32))) == {"norm1", "norm2", "swish"}


def test_without_rocm_sd_the_nodes_pass_through(comfy, monkeypatch):
    for name in [m for m in sys.modules if m == "rocm_sd" or m.startswith("rocm_sd.")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing rocm_sd or any part of it now raises ImportError
    _, nodes_module = load_node_package("rocm_sd_comfyui_without_library")
    assert nodes_module.UNAVAILABLE and "not importable" in nodes_module.UNAVAILABLE
    patcher = standin_model(comfy)
    assert nodes_module.RocmSDOptimizeModel().optimize(patcher)[0] is patcher
    vae = comfy["VAE"]()
    assert nodes_module.RocmSDOptimizeVAE().optimize(vae)[0] is vae


@pytest.mark.gpu
def test_optimized_model_on_the_gpu_uses_the_kernels(comfy, nodes):
    patcher = standin_model(comfy, "cuda", torch.float16, channels=32)
    x, ctx = model_inputs("cuda", torch.float16)
    reference = run_model(patcher, x, ctx)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    got, stats = run_patched_with_stats(optimized, x, ctx)
    n_group_norms = sum(isinstance(m, torch.nn.GroupNorm) for m in patcher.model.modules())
    n_layer_norms = sum(isinstance(m, torch.nn.LayerNorm) for m in patcher.model.modules())
    assert stats["group_norm"] == {"rocm_sd": n_group_norms} and stats["layer_norm"] == {"rocm_sd": n_layer_norms}
    assert (got.float() - reference.float()).abs().max().item() < 5e-2 * reference.float().abs().max().item()


# ---- rocm_sd Tune ------------------------------------------------------------------------------------------

class _Config:  # comfy/supported_models.py's config objects carry the UNet config ComfyUI detected
    def __init__(self, **unet_config):
        self.unet_config = unet_config


def test_tune_node_contract_and_architecture(comfy, nodes):
    cls = nodes.RocmSDTune
    required = cls.INPUT_TYPES()["required"]
    assert required["model"] == ("MODEL",) and cls.RETURN_TYPES == ("MODEL",) and cls.CATEGORY == "rocm_sd"
    assert {name: spec[0] for name, spec in required.items() if name != "model"} == {
        "width": "INT", "height": "INT", "batch_size": "INT", "budget_minutes": "INT", "resume": "BOOLEAN"}
    assert list(cls.INPUT_TYPES()["optional"]) == ["precision", "prepare"]
    patcher = standin_model(comfy)
    for unet_config, arch in (({"context_dim": 768, "adm_in_channels": None}, "sd15"),
                              ({"context_dim": 1024}, "sd21"),
                              ({"context_dim": 2048, "adm_in_channels": 2816}, "sdxl")):
        patcher.model.model_config = _Config(**unet_config)
        assert comfy_patch.model_architecture(patcher) == arch
    patcher.model.model_config = _Config(context_dim=1024, adm_in_channels=1536)  # SD2.1 unCLIP
    with pytest.raises(ValueError, match="class embedding 1536 wide"):
        comfy_patch.model_architecture(patcher)


def test_tune_node_runs_the_tuner_for_the_model_and_passes_it_through(comfy, nodes, monkeypatch):
    from rocm_sd import platform, prepare
    from rocm_sd.tune import cli as tune_cli

    runs, prepared = [], []
    monkeypatch.setattr(tune_cli, "main", lambda argv: runs.append(argv) or 0)
    monkeypatch.setattr(prepare, "run", lambda *args, **kwargs: prepared.append((args, kwargs)))
    monkeypatch.setattr(platform, "gpu_available", lambda: True)
    patcher = standin_model(comfy)
    patcher.model.model_config = _Config(context_dim=2048, adm_in_channels=2816)
    (out,) = nodes.RocmSDTune().tune(patcher, width=832, height=1216, batch_size=2, budget_minutes=5, resume=True)
    assert out is patcher
    assert runs == [["--model", "sdxl", "--width", "832", "--height", "1216", "--batch", "2", "--resume",
                     "--budget-s", "300"]]
    # its problems run once at the node's size, the VAE untiled as ComfyUI decodes it (the VAE node's fixed tiles are
    # off by default but with ROCm's torch)
    assert prepared == [(("sdxl", [(832, 1216)]), {"batch": 2, "vae_tiles": False})]
    monkeypatch.setattr(platform, "torch_gpu_platform", lambda: "hip")
    nodes.RocmSDTune().tune(patcher, width=832, height=1216, batch_size=2, budget_minutes=5, resume=True)
    assert prepared[1:] == [(("sdxl", [(832, 1216)]), {"batch": 2, "vae_tiles": tiles}) for tiles in (False, True)]
    del prepared[1:]
    monkeypatch.undo()
    monkeypatch.setattr(tune_cli, "main", lambda argv: runs.append(argv) or 0)
    monkeypatch.setattr(prepare, "run", lambda *args, **kwargs: prepared.append((args, kwargs)))
    runs.pop()
    nodes.RocmSDTune().tune(patcher, width=1024, height=1024, budget_minutes=0, resume=False, precision="fp8",
                            prepare=False)
    assert runs[-1] == ["--model", "sdxl", "--width", "1024", "--height", "1024", "--batch", "1", "--precision", "fp8"]
    assert len(prepared) == 1

    del patcher.model.model_config  # not a Stable Diffusion model rocm_sd knows: nothing tuned, passed through
    assert nodes.RocmSDTune().tune(patcher)[0] is patcher and len(runs) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the real tuner would tune")
def test_tune_node_on_a_machine_without_gpu_passes_through(comfy, nodes, caplog):
    patcher = standin_model(comfy)
    patcher.model.model_config = _Config(context_dim=768)
    # The real tuner: it refuses to measure without a GPU (exit 2), the node says so and passes the model on.
    assert nodes.RocmSDTune().tune(patcher, width=64, height=64)[0] is patcher
    assert "tuning stopped" in caplog.text and "exited 2" in caplog.text
    assert "nothing prepared: no GPU" in caplog.text


def test_vae_node_follows_a_circular_padding_set_later(comfy, nodes):
    """Seamless-tiling nodes set padding_mode="circular" on the VAE's Conv2d modules after the VAE node ran: the
    channels_last copies and the folded upsamplers (which assume zero padding) compute what ComfyUI computes."""
    vae = comfy["VAE"]()
    for p in vae.first_stage_model.parameters():
        p.data.normal_(0, 0.2)
    z = torch.randn(1, 4, 8, 8)
    (optimized,) = nodes.RocmSDOptimizeVAE().optimize(vae)
    with torch.inference_mode():
        zeros = vae.decode(z)
        for module in vae.first_stage_model.modules():
            if isinstance(module, torch.nn.Conv2d):
                module.padding_mode = "circular"
        reference = vae.decode(z)
        assert (reference - zeros).abs().max() > 1e-2
        torch.testing.assert_close(optimized.decode(z), reference, rtol=1e-5, atol=1e-5)


def _decoded_latent_shapes(vae):
    """Records the latent shapes the VAE's decoder runs on."""
    shapes = []
    vae.first_stage_model.decoder.conv_in.register_forward_pre_hook(lambda m, args: shapes.append(args[0].shape[-2:]))
    return shapes


def test_vae_node_fixed_tiles_decode_every_size_through_the_same_tile_shapes(comfy, nodes):
    """Issue 48 item 2 in ComfyUI: with fixed_tiles the VAE node's decode runs only tile shapes (64 / 96 / 128
    latents a side), so MIOpen's first-run search runs per tile shape, not per image size; a latent of one tile
    decodes as untiled, narrower ones and other ranks are ComfyUI's own decode."""
    from rocm_sd.modules import vae_tiles

    vae = comfy["VAE"]()
    for p in vae.first_stage_model.parameters():
        p.data.normal_(0, 0.2)
    (tiled_vae,) = nodes.RocmSDOptimizeVAE().optimize(vae, fixed_tiles="on")
    (untiled_vae,) = nodes.RocmSDOptimizeVAE().optimize(vae, fixed_tiles="off")
    assert "decode" in tiled_vae.patcher.object_patches and "decode" not in untiled_vae.patcher.object_patches
    shapes = _decoded_latent_shapes(vae)
    sizes = [(64, 64), (64, 100), (96, 160), (136, 72)]
    with torch.inference_mode():
        for height, width in sizes:
            z = torch.randn(2, 4, height, width, generator=torch.Generator().manual_seed(height + width))
            reference = untiled_vae.decode(z)
            shapes.clear()
            out = tiled_vae.decode(z)
            assert out.shape == reference.shape and torch.isfinite(out).all()
            expected = vae_tiles.tile_shapes(height, width)
            assert {tuple(s) for s in shapes} == expected and len(shapes) >= 2, (height, width, shapes)
            if expected == {(height, width)}:  # one tile a side: the untiled image, batch 1 at a time
                torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)
            else:  # the blend of the tiles differs from the untiled image as any tiled decode does, not wildly
                assert (out - reference).abs().mean() < 0.25 * reference.abs().mean()
        z = torch.randn(1, 4, 8, 8)
        shapes.clear()
        torch.testing.assert_close(tiled_vae.decode(z), untiled_vae.decode(z), rtol=0, atol=0)
        assert [tuple(s) for s in shapes] == [(8, 8)] * 2
        # a circular padding set later (seamless textures) wraps the whole image: untiled again
        for module in vae.first_stage_model.modules():
            if isinstance(module, torch.nn.Conv2d):
                module.padding_mode = "circular"
        z = torch.randn(1, 4, 64, 100)
        shapes.clear()
        torch.testing.assert_close(tiled_vae.decode(z), untiled_vae.decode(z), rtol=0, atol=0)
        assert [tuple(s) for s in shapes] == [(64, 100)] * 2
        model = vae.first_stage_model  # the input VAE is ComfyUI's own again once the optimized one is unloaded
        assert vae.patcher.object_patches == {} and torch.equal(vae.decode(z), type(model).decode(model, z))


def test_vae_node_fixed_tiles_auto_is_on_with_rocms_torch_only(comfy, nodes, monkeypatch):
    from rocm_sd import platform

    vae = comfy["VAE"]()
    assert "decode" not in nodes.RocmSDOptimizeVAE().optimize(vae)[0].patcher.object_patches  # CPU torch: off
    monkeypatch.setattr(platform, "torch_gpu_platform", lambda: "hip")
    assert "decode" in nodes.RocmSDOptimizeVAE().optimize(vae)[0].patcher.object_patches
    assert "decode" not in nodes.RocmSDOptimizeVAE().optimize(vae, fixed_tiles="off")[0].patcher.object_patches


def test_each_execution_says_what_it_declined_and_that_step_caching_changes_images(comfy, nodes, caplog):
    """Issue 46, item 7: step caching changes images, and it said nothing; a declined option was said at the first
    execution of the session only. Every execution says both, each line once."""
    import logging

    from comfy.ldm.modules.diffusionmodules.openaimodel import LeveledUNetModel

    patcher = standin_model(comfy, unet_model=LeveledUNetModel, attention_levels=(1,), adm_in_channels=12)
    caplog.set_level(logging.INFO, logger="rocm_sd.comfyui")
    for _ in range(2):
        caplog.clear()
        for name in ("precision", "attention_precision"):  # a second node of the workflow declining the same
            nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False, cache="deepcache", **{name: "fp8"})
            lines = [r.getMessage() for r in caplog.records if r.name == "rocm_sd.comfyui"]
            caplog.clear()
            cache = [line for line in lines if "step cache 'deepcache' active" in line]
            assert len(cache) == 1 and "images differ" in cache[0] and "one full evaluation in 3" in cache[0]
            assert len([line for line in lines if f"{name}=fp8 not applied" in line]) == 1
            assert len(lines) == len(set(lines))
    (plain,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False)
    assert not any("step cache" in r.getMessage() for r in caplog.records)
