"""The A1111 extension's "rocm_sd" tab (integrations/a1111/scripts/rocm_sd_prepare.py): its Prepare button runs
rocm_sd.prepare for the webui's loaded model, against the stand-in of the webui modules (tests/standins/a1111).
integrations/a1111/check_in_a1111.py presses it in a real webui."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from rocm_sd import prepare
from rocm_sd.patch.a1111 import FEATURES, prepare_flags
from rocm_sd.patch.flags import FLAG_NAMES

from tests.test_a1111 import EXTENSION, _load, webui  # noqa: F401  (the stand-in webui fixture)

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


@pytest.fixture()
def tab(webui, monkeypatch):
    """The tab's script as the webui loads it, with prepare.run recorded (a real run builds a whole random model)."""
    from modules import call_queue, sd_models

    runs = []

    def run(model, sizes=None, **kwargs):
        runs.append({"model": model, "sizes": sizes, "lock held": call_queue.queue_lock.locked(),
                     "moves before": list(sd_models.moves), **kwargs})
        if model == "sdxl" and kwargs.get("batch") == 7:
            raise torch.cuda.OutOfMemoryError("HIP out of memory")
        return prepare.Prepared(model, lines=[f"prepared {model}", "on a CPU: nothing searched"])

    monkeypatch.setattr(prepare, "run", run)
    sd_models.moves.clear()
    script = _load(os.path.join(EXTENSION, "scripts", "rocm_sd_prepare.py"), "rocm_sd_prepare_under_test")
    yield SimpleNamespace(script=script, runs=runs, sd_models=sd_models)
    sd_models.model_data.sd_model = None


def _load_model(sd_models, path: str):
    model = SimpleNamespace(sd_checkpoint_info=SimpleNamespace(filename=path))
    sd_models.model_data.sd_model = model
    return model


def test_prepare_flags_are_the_features_and_nothing_the_webuis_model_lacks():
    on = prepare_flags(dict.fromkeys(FEATURES, True) | {"attention": True, "channels_last": False})
    assert set(on) == set(FLAG_NAMES)
    assert {name for name, value in on.items() if value} == {"group_norm", "layer_norm", "fold_upsample", "attention"}
    assert not any(prepare_flags(None).values())  # the webui's own model: nothing of rocm_sd's
    with pytest.raises(ValueError, match="'tiling' is not an optimize"):
        prepare_flags({"tiling": True})


def test_the_tab_is_registered(webui, tab):
    assert webui["callbacks"].callbacks_ui_tabs == [tab.script.on_ui_tabs]


def test_prepare_runs_for_the_loaded_model_with_its_patches(webui, tab, tmp_path):
    from modules import sd_hijack

    model = _load_model(tab.sd_models, _checkpoint(tmp_path, "sdxl"))
    sd_hijack.current_optimizer = SimpleNamespace(name="rocm_sd")
    webui["shared"].opts.rocm_sd_channels_last = False
    try:
        text = tab.script.prepare_loaded_model("1024x1024, 832x1216", 2.0)  # gr.Number may give a float
    finally:
        del webui["shared"].opts.rocm_sd_channels_last
    assert text == "prepared sdxl\non a CPU: nothing searched"
    [run] = tab.runs
    expected = prepare_flags(dict.fromkeys(FEATURES, True) | {"attention": True, "channels_last": False})
    assert {k: run[k] for k in expected} == expected
    assert (run["model"], run["sizes"], run["batch"], run["device"], run["dtype"]) == (
        "sdxl", [(1024, 1024), (832, 1216)], 2, torch.device("cpu"), None)
    # Under the webui's queue lock, with the webui's model on the CPU meanwhile, and back after.
    assert run["lock held"] and run["moves before"] == [("cpu", model)]
    assert tab.sd_models.moves == [("cpu", model), ("device", model)]


def test_prepare_for_the_webuis_own_model_and_its_default_size(webui, tab, tmp_path):
    from modules import sd_hijack

    _load_model(tab.sd_models, _checkpoint(tmp_path, "sd15"))
    sd_hijack.current_optimizer = SimpleNamespace(name="sdp")  # rocm_sd not applied: the webui's own problems
    assert tab.script.prepare_loaded_model("  ", 1) == "prepared sd15\non a CPU: nothing searched"
    [run] = tab.runs
    assert run["model"] == "sd15" and run["sizes"] is None and not any(run[k] for k in FLAG_NAMES)


@pytest.mark.parametrize("arch,sizes,batch,why", [
    (None, "512x512", 1, "nothing prepared: no model is loaded"),
    ("sd15", "512", 1, "nothing prepared: image sizes: 512 is not WIDTHxHEIGHT"),
    ("sd15", "512x500", 1, "nothing prepared: image sizes: 512x500: "),
    ("sd15", "512x512", 0, "nothing prepared: batch size: 0 is not a positive integer"),
    ("sd15", "512x512", 1.5, "nothing prepared: batch size: 1.5 is not a positive integer"),
    ("unknown", "512x512", 1, "nothing prepared: .*no Stable Diffusion UNet found"),
    ("missing", "512x512", 1, "nothing prepared: "),
    ("sdxl", "512x512", 7, r"prepare stopped \(OutOfMemoryError: HIP out of memory\); the first image will search"),
])
def test_bad_input_or_a_failed_run_is_a_message_not_a_traceback(tab, tmp_path, arch, sizes, batch, why):
    import re

    if arch is not None:
        path = str(tmp_path / "gone.safetensors") if arch == "missing" else _checkpoint(tmp_path, arch)
        model = _load_model(tab.sd_models, path)
    text = tab.script.prepare_loaded_model(sizes, batch)
    assert re.match(why, text), text
    ran = arch == "sdxl"
    assert len(tab.runs) == ran
    # The model goes back to its device whether prepare ran, failed or never started.
    assert tab.sd_models.moves == ([("cpu", model), ("device", model)] if ran else [])
