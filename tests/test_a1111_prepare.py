"""The A1111 extension's "rocm_sd" tab (integrations/a1111/scripts/rocm_sd_prepare.py): its Prepare button runs the
webui's own loaded model (a one-step txt2img per size) under rocm_sd.prepare's machinery, against the stand-in of
the webui modules (tests/standins/a1111). integrations/a1111/check_in_a1111.py presses it in a real webui."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from tests.test_a1111 import EXTENSION, ROOT, STANDINS, _load, webui  # noqa: F401  (the stand-in webui fixture)

LDM = "model.diffusion_model."


def _checkpoint(tmp_path, arch: str) -> str:
    """A file holding only the tensors rocm_sd.checkpoints reads, as the webui's LDM checkpoints name them."""
    tensors = {"sd15": {LDM + "input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": (8, 768)},
               "sdxl": {LDM + "label_emb.0.0.weight": (8, 2816),
                        LDM + "input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight": (8, 2048)},
               "unknown": {"first_stage_model.decoder.conv_in.weight": (8, 4, 3, 3)}}[arch]
    path = str(tmp_path / f"{arch}.safetensors")
    save_file({k: torch.zeros(shape, dtype=torch.float16) for k, shape in tensors.items()}, path)
    return path


class _UNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_in, self.context, self.conv_out = (torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.Linear(16, 8),
                                                     torch.nn.Conv2d(8, 4, 3, padding=1))

    def forward(self, x, timesteps=None, context=None, y=None):
        h = self.conv_in(x) + self.context(context.mean(1))[:, :, None, None]
        return self.conv_out(torch.nn.functional.silu(h))


class TinyWebuiModel(torch.nn.Module):
    """A webui model's interface as the stand-in txt2img calls it (ldm's LatentDiffusion: model.diffusion_model,
    first_stage_model, get_learned_conditioning, apply_model, decode_first_stage), with convolutions and GEMMs.
    `calls` records each UNet and VAE call's batch and whether the webui's queue lock was held."""

    def __init__(self, checkpoint: str):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.diffusion_model = _UNet()
        self.text = torch.nn.Linear(4, 16)
        self.first_stage_model = torch.nn.Sequential(
            torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.GroupNorm(4, 8), torch.nn.Upsample(scale_factor=2),
            torch.nn.Conv2d(8, 3, 3, padding=1))
        self.sd_checkpoint_info = SimpleNamespace(filename=checkpoint)
        self.calls, self.fail_at_batch = [], None

    def _locked(self) -> bool:
        from modules.call_queue import queue_lock

        return queue_lock.locked()

    def get_learned_conditioning(self, prompts):
        return self.text(torch.ones(len(prompts), 77, 4) * len(prompts[0]))

    def apply_model(self, x, t, cond):
        if x.shape[0] == self.fail_at_batch:
            raise torch.cuda.OutOfMemoryError("HIP out of memory")
        self.calls.append(("unet", x.shape[0], self._locked()))
        return self.model.diffusion_model(x, t, context=cond)

    def decode_first_stage(self, z):
        self.calls.append(("vae", z.shape[0], self._locked()))
        return self.first_stage_model(z)


@pytest.fixture()
def tab(webui):
    """The tab's script as the webui loads it."""
    from modules import processing, sd_models

    processing.runs.clear()
    script = _load(os.path.join(EXTENSION, "scripts", "rocm_sd_prepare.py"), "rocm_sd_prepare_under_test")
    yield SimpleNamespace(script=script, sd_models=sd_models, processing=processing, state=webui["shared"].state)
    sd_models.model_data.sd_model = None


def _load_model(sd_models, path: str) -> TinyWebuiModel:
    torch.manual_seed(0)
    model = TinyWebuiModel(path).eval()
    sd_models.model_data.sd_model = model
    return model


def test_the_tab_is_registered(webui, tab):
    assert webui["callbacks"].callbacks_ui_tabs == [tab.script.on_ui_tabs]


def test_prepare_runs_the_webuis_own_model_once_per_size(tab, tmp_path):
    model = _load_model(tab.sd_models, _checkpoint(tmp_path, "sdxl"))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    text = tab.script.prepare_loaded_model("64x64, 96x64", 2.0)  # gr.Number may give a float
    lines = text.splitlines()
    assert lines[0] == ("rocm_sd prepare: sdxl.safetensors, the webui's model (UNet float32, VAE float32, "
                        "optimization none), batch 2, on cpu; a Euler step of txt2img and its VAE decode per size")
    # At the first size: the UNet's 2 convolutions and its context GEMM at cond + uncond (twice the batch), the text
    # encoder's GEMM (prompt and negative prompt: one problem), the VAE's 2 convolutions (one image at a time, as the
    # webui decodes). At the second, only the convolutions are new: the linear layers' problems are the same.
    assert re.fullmatch(r"  64x64: [\d.]+ s, 4 new convolution and 2 new GEMM problems", lines[1]), lines[1]
    assert re.fullmatch(r"  96x64: [\d.]+ s, 4 new convolution and 0 new GEMM problems", lines[2]), lines[2]
    assert lines[-1].startswith("prepared 2 sizes in ") and "8 convolution and 2 GEMM problems; on a CPU" in lines[-1]
    runs = [(p.width, p.height, p.steps, p.batch_size, p.sampler_name, p.do_not_save_samples, p.do_not_save_grid,
             p.closed) for p in tab.processing.runs]
    assert runs == [(64, 64, 1, 2, "Euler", True, True, True), (96, 64, 1, 2, "Euler", True, True, True)]
    assert model.calls == [("unet", 4, True), ("vae", 1, True), ("vae", 1, True)] * 2  # all under the queue lock
    assert tab.state.jobs == [("begin", "rocm_sd_prepare"), ("end",)]
    # The webui's model is neither moved nor changed.
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    assert {p.device for p in model.parameters()} == {torch.device("cpu")}


def test_prepare_runs_the_problems_of_rocm_sds_patches_as_applied(tab, tmp_path):
    """With rocm_sd applied (here its channels_last convolutions) the problems are the patched model's: convolutions
    on channels_last activations, other searches than the webui's own model's."""
    from rocm_sd.patch.a1111 import patch_sd_model

    model = _load_model(tab.sd_models, _checkpoint(tmp_path, "sd15"))
    prepared, real = [], tab.script.prepare.run_sizes
    tab.script.prepare.run_sizes = lambda *a, **k: prepared.append(real(*a, **k)) or prepared[-1]
    try:
        tab.script.prepare_loaded_model("64x64", 1)
        record = patch_sd_model(model, group_norm=False, layer_norm=False, fold_upsample=False, channels_last=True,
                                cuda_graph=False, host_path=lambda module: False)
        try:
            tab.script.prepare_loaded_model("64x64", 1)
        finally:
            record.revert()
    finally:
        tab.script.prepare.run_sizes = real
    own, patched = ({key for key, kind in result.problems.items() if kind == "convolution"} for result in prepared)
    def channels_last(problems):  # the input's channel stride is 1
        return {key for key in problems if key[1][0].stride[1] == 1}

    assert len(own) == len(patched) == 4 and not channels_last(own)
    assert channels_last(patched) and channels_last(patched) <= patched - own


def test_prepare_without_sizes_takes_the_models_own_size(tab, tmp_path):
    _load_model(tab.sd_models, _checkpoint(tmp_path, "sd15"))
    text = tab.script.prepare_loaded_model("  ", 1)
    assert text.splitlines()[1].startswith("  512x512: ")
    assert [(p.width, p.height) for p in tab.processing.runs] == [(512, 512)]


@pytest.mark.parametrize("arch,sizes,batch,why", [
    (None, "512x512", 1, "nothing prepared: no model is loaded"),
    ("sd15", "512", 1, "nothing prepared: image sizes: 512 is not WIDTHxHEIGHT"),
    ("sd15", "512x500", 1, "nothing prepared: image sizes: 512x500: "),
    ("sd15", "512x512", 0, "nothing prepared: batch size: 0 is not a positive integer"),
    ("sd15", "512x512", 1.5, "nothing prepared: batch size: 1.5 is not a positive integer"),
    ("unknown", "", 1, "nothing prepared: .*no Stable Diffusion UNet found"),
    ("missing", "", 1, "nothing prepared: "),
    ("sdxl", "64x64", 7, r"prepare stopped \(OutOfMemoryError: HIP out of memory\); the first image will search"),
])
def test_bad_input_or_a_failed_run_is_a_message_not_a_traceback(tab, tmp_path, arch, sizes, batch, why):
    if arch is not None:
        path = str(tmp_path / "gone.safetensors") if arch == "missing" else _checkpoint(tmp_path, arch)
        model = _load_model(tab.sd_models, path)
        model.fail_at_batch = 14  # the UNet's batch for 7 images with CFG
    text = tab.script.prepare_loaded_model(sizes, batch)
    assert re.match(why, text), text
    ran = arch == "sdxl"
    assert len(tab.processing.runs) == ran
    # A run that failed ended its job and let go of the queue lock; input refused started none.
    assert tab.state.jobs == ([("begin", "rocm_sd_prepare"), ("end",)] if ran else [])
    from modules.call_queue import queue_lock

    assert not queue_lock.locked()


def test_the_a1111_prepare_path_never_imports_diffusers(tmp_path):
    """In a process where importing diffusers fails (as beside the webui's pinned huggingface_hub), the button
    prepares; and no import of diffusers was even tried."""
    script = textwrap.dedent(f"""
        import importlib.abc, os, sys
        tried = []

        class NoDiffusers(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "diffusers":
                    tried.append(name)
                    raise ImportError("cannot import name 'resolve_revision' from 'huggingface_hub'")

        sys.meta_path.insert(0, NoDiffusers())
        try:
            import diffusers  # the blocker works: the check below can fail
            raise SystemExit("diffusers imported despite the blocker")
        except ImportError:
            tried.clear()
        sys.path.insert(0, {STANDINS!r})
        from tests.test_a1111 import _load
        from tests.test_a1111_prepare import TinyWebuiModel, _checkpoint
        from modules import sd_models
        import pathlib
        script = _load(os.path.join({EXTENSION!r}, "scripts", "rocm_sd_prepare.py"), "rocm_sd_prepare")
        sd_models.model_data.sd_model = TinyWebuiModel(_checkpoint(pathlib.Path({str(tmp_path)!r}), "sd15"))
        text = script.prepare_loaded_model("64x64", 1)
        print(text)
        assert text.splitlines()[-1].startswith("prepared 1 size in "), text
        assert not tried and not [m for m in sys.modules if m.split(".")[0] == "diffusers"], tried
        print("NO DIFFUSERS")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert result.returncode == 0 and result.stdout.rstrip().endswith("NO DIFFUSERS"), result.stdout + result.stderr


class _ForgeRocmSdScript:
    """The extension's RocmSdScript as Forge's script runner holds it: its per-sampling callback installs a patched
    UNet patcher (here a marker) on the model's forge_objects, as the real one installs a patched clone."""

    def __init__(self, name="rocm_sd"):
        self.name, self.calls = name, []

    def title(self):
        return self.name

    def process_before_every_sampling(self, p, *args, **kwargs):
        self.calls.append((args, sorted(kwargs)))
        p.sd_model.forge_objects.unet = "rocm_sd's clone"


class ForgeWebuiModel(TinyWebuiModel):
    """A Forge model: its UNet patcher in forge_objects; each UNet call records the patcher it ran with."""

    def __init__(self, checkpoint: str):
        super().__init__(checkpoint)
        self.forge_objects = SimpleNamespace(unet="Forge's own patcher")

    def apply_model(self, x, t, cond):
        self.calls.append(("unet with", self.forge_objects.unet))
        return super().apply_model(x, t, cond)


@pytest.mark.parametrize("rocm_sd_on", [True, False])
def test_on_forge_prepare_samples_with_rocm_sd_installed_as_a_generation_installs_it(tab, tmp_path, webui,
                                                                                      monkeypatch, rocm_sd_on):
    """Forge installs rocm_sd only per sampling, through p.scripts (which a txt2img built by the tab lacks): the run
    gets a runner forwarding just that callback to the extension's script, so the problems prepared are those of the
    patched model; no other script's callbacks run. Without --rocm-sd, Forge's own model, and the line says so."""
    from modules import scripts

    torch.manual_seed(0)
    model = ForgeWebuiModel(_checkpoint(tmp_path, "sd15"))
    tab.sd_models.model_data.sd_model = model
    ours, other = _ForgeRocmSdScript(), _ForgeRocmSdScript("ControlNet")
    monkeypatch.setattr(scripts, "scripts_txt2img", SimpleNamespace(alwayson_scripts=[other, ours]), raising=False)
    monkeypatch.setattr(webui["shared"].cmd_opts, "rocm_sd", rocm_sd_on, raising=False)
    lines = tab.script.prepare_loaded_model("64x64", 1).splitlines()
    assert lines[-1].startswith("prepared 1 size in "), lines
    unet_calls = [call for call in model.calls if call[0] == "unet with"]
    assert other.calls == []
    if rocm_sd_on:
        assert "optimization rocm_sd per sampling" in lines[0]
        assert ours.calls == [((), ["c", "noise", "uc", "x"])]
        assert unet_calls == [("unet with", "rocm_sd's clone")]
    else:
        assert "optimization Forge's own (rocm_sd not on: --rocm-sd)" in lines[0]
        assert ours.calls == [] and unet_calls == [("unet with", "Forge's own patcher")]
        assert all(p.scripts is None for p in tab.processing.runs)
