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
WEBUI_MODULES = ("modules", "ldm", "sgm", "launch")


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
    import launch

    launch.installed = {"rocm_sd"}
    _load(os.path.join(EXTENSION, "install.py"), "rocm_sd_a1111_install")
    assert launch.pip_calls == []
    launch.installed = set()
    _load(os.path.join(EXTENSION, "install.py"), "rocm_sd_a1111_install")
    assert len(launch.pip_calls) == 1 and launch.pip_calls[0] == f'install --no-build-isolation -e "{ROOT}"'


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
