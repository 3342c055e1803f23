"""The AUTOMATIC1111 extension (integrations/a1111) against the stand-in of the webui modules it touches
(tests/standins/a1111; the webui is not installable here). It must also be tried in a real webui."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTENSION = os.path.join(ROOT, "integrations", "a1111")
STANDINS = os.path.join(ROOT, "tests", "standins", "a1111")
WEBUI_MODULES = ("modules", "ldm", "sgm", "launch", "gradio")


def _load(path: str, name: str):
    """As the webui loads extension scripts: a module from its file path."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def webui():
    sys.path.insert(0, STANDINS)
    from modules import script_callbacks, sd_hijack_optimizations, shared

    script_callbacks.callbacks_list_optimizers.clear()
    sd_hijack_optimizations.SdOptimization().undo()  # the webui's own forwards, as at startup
    yield {"callbacks": script_callbacks, "optimizations": sd_hijack_optimizations, "shared": shared}
    sys.path.remove(STANDINS)
    for name in [m for m in sys.modules if m.split(".")[0] in WEBUI_MODULES]:
        del sys.modules[name]


@pytest.fixture()
def script(webui):
    return _load(os.path.join(EXTENSION, "scripts", "rocm_sd_a1111.py"), "rocm_sd_a1111_under_test")


def test_registers_an_sd_optimization(webui, script):
    listed = webui["callbacks"].list_optimizers_callback()
    assert [type(o).__name__ for o in listed] == ["SdOptimizationRocmSd"]
    option = listed[0]
    assert isinstance(option, webui["optimizations"].SdOptimization)
    assert (option.name, option.cmd_opt, option.priority) == ("rocm_sd", "rocm_sd", 110)
    assert option.title() == "rocm_sd - rocm_sd kernels (AMD GPUs)"
    assert option.is_available() == torch.cuda.is_available()


def test_preload_adds_the_flag(webui):
    import argparse

    parser = argparse.ArgumentParser()
    _load(os.path.join(EXTENSION, "preload.py"), "rocm_sd_a1111_preload").preload(parser)
    assert parser.parse_args(["--rocm-sd"]).rocm_sd is True and parser.parse_args([]).rocm_sd is False


def test_install_builds_rocm_sd_only_when_missing(webui):
    """Only when rocm_sd is missing; the build requirements first where the webui's Python lacks them (a build
    without isolation finds no scikit-build-core or pybind11 of its own)."""
    import ast
    import re

    import launch

    editable = f'install --no-build-isolation -e "{ROOT}"'
    launch.installed = {"rocm_sd"}
    _load(os.path.join(EXTENSION, "install.py"), "rocm_sd_a1111_install")
    assert launch.pip_calls == []
    launch.installed = {"scikit-build-core", "pybind11"}
    _load(os.path.join(EXTENSION, "install.py"), "rocm_sd_a1111_install")
    assert launch.pip_calls == [editable]
    launch.pip_calls.clear()
    launch.installed = set()
    install = _load(os.path.join(EXTENSION, "install.py"), "rocm_sd_a1111_install")
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:  # [build-system]'s one-line list
        requires = ast.literal_eval(re.search(r"^requires = (\[.*\])$", f.read(), re.M).group(1))
    assert sorted(install.BUILD_REQUIRES.values()) == sorted(requires)
    assert launch.pip_calls == ["install " + " ".join(f'"{spec}"' for spec in requires), editable]


def _hypernetwork(device, dtype):
    torch.manual_seed(5)
    return {24: (torch.nn.Linear(24, 24).to(device, dtype), torch.nn.Linear(24, 24).to(device, dtype))}


DEVICES = [("cpu", torch.float32), pytest.param("cuda", torch.float16, marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("upcast", [False, True])
@pytest.mark.parametrize("with_hypernetwork", [False, True])
def test_apply_computes_what_the_webuis_sdp_computes_and_undo_restores(webui, script, device, dtype, upcast,
                                                                       with_hypernetwork):
    import ldm.modules.attention as ldm_attention
    import ldm.modules.diffusionmodules.model as ldm_model
    import sgm.modules.attention as sgm_attention

    shared, optimizations = webui["shared"], webui["optimizations"]
    shared.opts.upcast_attn = upcast
    shared.loaded_hypernetworks = [_hypernetwork(device, dtype)] if with_hypernetwork else []
    torch.manual_seed(0)
    cross = ldm_attention.CrossAttention(32, 24, heads=4, dim_head=8).to(device, dtype)
    self_attention = ldm_attention.CrossAttention(32, None, heads=4, dim_head=8).to(device, dtype)
    block = ldm_model.AttnBlock(16).to(device, dtype)
    x, ctx = torch.randn(2, 64, 32, device=device, dtype=dtype), torch.randn(2, 77, 24, device=device, dtype=dtype)
    image = torch.randn(1, 16, 8, 8, device=device, dtype=dtype)
    with torch.inference_mode():
        optimizations.SdOptimizationSdp().apply()
        expected = cross(x, ctx), self_attention(x), block(image)
        option = script.SdOptimizationRocmSd()
        option.apply()
        assert ldm_attention.CrossAttention.forward is script.cross_attention_forward
        assert sgm_attention.CrossAttention.forward is script.cross_attention_forward
        assert ldm_model.AttnBlock.forward is script.attnblock_forward
        got = cross(x, ctx), self_attention(x), block(image)
        option.undo()
        assert ldm_attention.CrossAttention.forward is not script.cross_attention_forward
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=tol, atol=tol)
    shared.opts.upcast_attn, shared.loaded_hypernetworks = False, []


def test_without_rocm_sd_nothing_registers(webui, monkeypatch):
    for name in [m for m in sys.modules if m == "rocm_sd" or m.startswith("rocm_sd.")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing rocm_sd or any part of it now raises ImportError
    script = _load(os.path.join(EXTENSION, "scripts", "rocm_sd_a1111.py"), "rocm_sd_a1111_without_library")
    assert script.UNAVAILABLE and webui["callbacks"].list_optimizers_callback() == []


def test_forge_gets_a_patched_clone_of_its_unet_patcher(webui, script):
    """Forge: process_before_every_sampling swaps in a clone with rocm_sd installed (--rocm-sd only)."""
    from types import SimpleNamespace

    comfy_root = os.path.join(ROOT, "tests", "standins")
    sys.path.insert(0, comfy_root)
    try:
        import comfy.model_base
        import comfy.model_patcher

        torch.manual_seed(0)
        base = comfy.model_base.BaseModel().eval()
        for param in base.parameters():
            param.data.normal_(0, 0.2)
        original = comfy.model_patcher.ModelPatcher(base)
        p = SimpleNamespace(sd_model=SimpleNamespace(forge_objects=SimpleNamespace(unet=original)))
        forge = script.RocmSdScript()
        forge.process_before_every_sampling(p)
        assert p.sd_model.forge_objects.unet is original  # not asked for: untouched
        webui["shared"].cmd_opts.rocm_sd = True
        forge.process_before_every_sampling(p)
        patched = p.sd_model.forge_objects.unet
        assert patched is not original and original.object_patches == {}
        assert patched.object_patches and "attn1" in patched.model_options["transformer_options"]["patches_replace"]
        x, ctx = torch.randn(2, 4, 8, 8), torch.randn(2, 5, 24)
        with torch.inference_mode():
            expected = base.apply_model(x, None, ctx, transformer_options=original.model_options["transformer_options"])
            patched.patch_model()
            try:
                got = base.apply_model(x, None, ctx, transformer_options=patched.model_options["transformer_options"])
            finally:
                patched.unpatch_model()
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    finally:
        webui["shared"].cmd_opts.rocm_sd = False
        sys.path.remove(comfy_root)
        for name in [m for m in sys.modules if m == "comfy" or m.startswith("comfy.")]:
            del sys.modules[name]


class _Upsample(torch.nn.Module):
    """The VAE's Upsample as ldm writes it (nearest 2x, then a 3x3 conv)."""

    def __init__(self, channels):
        super().__init__()
        self.with_conv, self.conv = True, torch.nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest"))


_Upsample.__name__ = "Upsample"


class _Block(torch.nn.Module):
    """An ldm ResBlock's in_layers and a transformer block's LayerNorm, on a small UNet."""

    def __init__(self):
        super().__init__()
        self.in_layers = torch.nn.Sequential(torch.nn.GroupNorm(4, 8), torch.nn.SiLU(), torch.nn.Conv2d(8, 8, 3, padding=1))
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x, timesteps=None, context=None, y=None):
        h = self.in_layers(x)
        return self.norm(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _tiny_sd_model():
    from types import SimpleNamespace

    torch.manual_seed(0)
    model = SimpleNamespace(model=torch.nn.Module(), first_stage_model=torch.nn.Sequential(
        torch.nn.GroupNorm(4, 8), _Upsample(8)))
    model.model.diffusion_model = _Block()
    for module in (model.model, model.first_stage_model):
        for p in module.parameters():
            p.data.normal_(0, 0.3)
    return model


def test_patch_sd_model_computes_the_same_and_reverts_exactly(webui, monkeypatch):
    """patch/a1111.py on an ldm-shaped model: every feature swaps what it should, the outputs agree, LoRA's lazy
    weight merge runs for the kernel-backed copies (the webui's patched forwards do it for its own), and revert puts
    back the very modules."""
    from types import SimpleNamespace

    from rocm_sd.patch.a1111 import patch_sd_model

    merged = []
    monkeypatch.setitem(sys.modules, "networks", SimpleNamespace(
        loaded_networks=[], network_apply_weights=lambda module: merged.append(type(module).__name__)))
    model = _tiny_sd_model()
    unet, vae = model.model.diffusion_model, model.first_stage_model
    def tree():
        return [("unet", n, m) for n, m in unet.named_modules()] + [("vae", n, m) for n, m in vae.named_modules()]

    originals = tree()
    x, z = torch.randn(2, 8, 6, 6), torch.randn(1, 8, 4, 4)
    with torch.inference_mode():
        expected = unet(x), vae(z)
        record = patch_sd_model(model)
        assert type(unet.in_layers[0]).__name__ == "RocmGroupNorm" and isinstance(unet.in_layers[1], torch.nn.Identity)
        assert type(unet.norm).__name__ == "RocmLayerNorm" and type(unet.in_layers[2]).__name__ == "RocmConv2d"
        assert type(vae[1]).__name__ == "RocmUpsample" and "forward" in unet.__dict__
        got = unet(x), vae(z)
        assert "RocmConv2d" in merged and "RocmGroupNorm" in merged
        record.revert()
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    assert "forward" not in unet.__dict__
    after = tree()
    assert len(after) == len(originals) and all(a[:2] == b[:2] and a[2] is b[2] for a, b in zip(after, originals))


def test_settings_apply_and_undo_follow_the_optimization(webui, script):
    """The Settings checkboxes exist; apply() patches the loaded model, a checkbox change re-patches it without that
    feature, undo() (another optimization selected) restores it."""
    from modules import sd_models

    shared = webui["shared"]
    webui["callbacks"].ui_settings_callback()
    assert {f"rocm_sd_{f}" for f in script.OPTIONS} <= set(shared.opts.data_labels)
    model = _tiny_sd_model()
    sd_models.model_data.sd_model = model
    try:
        option = script.SdOptimizationRocmSd()
        option.apply()
        assert type(model.model.diffusion_model.in_layers[2]).__name__ == "RocmConv2d"
        shared.opts.set("rocm_sd_channels_last", False)
        assert type(model.model.diffusion_model.in_layers[2]) is torch.nn.Conv2d
        assert type(model.model.diffusion_model.in_layers[0]).__name__ == "RocmGroupNorm"
        option.undo()
        assert not any(type(m).__name__.startswith("Rocm") for m in model.model.modules())
        webui["callbacks"].model_loaded_callback(model)  # not the optimization any more: left alone
        assert not any(type(m).__name__.startswith("Rocm") for m in model.model.modules())
    finally:
        sd_models.model_data.sd_model = None
        shared.opts.set("rocm_sd_channels_last", True)


def test_tiling_sets_circular_padding_after_the_patch_and_the_copies_follow(webui, monkeypatch):
    """The webui's "Tiling" (sd_hijack's apply_circular) sets padding_mode="circular" on the convolutions it gathered
    when the model loaded, the originals, after rocm_sd patched the model: the channels_last copies and the folded VAE
    upsampler (which assumes zero padding) must compute what the webui computes with it."""
    from types import SimpleNamespace

    from rocm_sd.patch.a1111 import patch_sd_model

    model = _tiny_sd_model()
    unet, vae = model.model.diffusion_model, model.first_stage_model
    gathered = [m for m in (*unet.modules(), *vae.modules()) if type(m) == torch.nn.Conv2d]
    x, z = torch.randn(2, 8, 6, 6), torch.randn(1, 8, 4, 4)
    record = patch_sd_model(model)
    monkeypatch.setitem(sys.modules, "modules.sd_hijack",
                        SimpleNamespace(model_hijack=SimpleNamespace(circular_enabled=True)))
    for conv in gathered:
        conv.padding_mode = "circular"
    with torch.inference_mode():
        got = unet(x), vae(z)
        record.revert()
        expected = unet(x), vae(z)
        for conv in gathered:
            conv.padding_mode = "zeros"
        zeros = vae(z)
    assert (expected[1] - zeros).abs().max() > 1e-2  # the padding mode matters at this size
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
