"""Single-file checkpoints (rocm_sd/checkpoints.py): the architecture from tensor names and shapes alone, and
`python -m rocm_sd.tune --model file.safetensors`. The files here hold only the tensors the detection reads,
in the layouts real checkpoints use (LDM as A1111 and ComfyUI load it, ComfyUI's UNet-only, diffusers' UNet)."""
import pytest
import torch
from safetensors.torch import save_file

from rocm_sd import checkpoints
from rocm_sd.tune.cli import main as tune_main

LDM = "model.diffusion_model."
SD15_CROSS = "input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"
DIFFUSERS_CROSS = "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"


def _file(tmp_path, tensors: dict, name="model.safetensors") -> str:
    path = str(tmp_path / name)
    save_file({k: torch.zeros(shape, dtype=torch.float16) for k, shape in tensors.items()}, path)
    return path


@pytest.mark.parametrize("tensors,arch", [
    ({LDM + SD15_CROSS: (8, 768), "cond_stage_model.transformer.text_model.final_layer_norm.weight": (768,)}, "sd15"),
    ({SD15_CROSS: (8, 1024)}, "sd21"),                                   # ComfyUI's UNet-only file
    ({LDM + "label_emb.0.0.weight": (8, 2816), LDM + "input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight":
      (8, 2048)}, "sdxl"),
    ({DIFFUSERS_CROSS: (8, 768)}, "sd15"),                               # diffusers' UNet
    ({"add_embedding.linear_1.weight": (8, 2816), DIFFUSERS_CROSS: (8, 2048)}, "sdxl"),
])
def test_architecture_from_names_and_shapes(tmp_path, tensors, arch):
    assert checkpoints.architecture_of(_file(tmp_path, tensors)) == arch


@pytest.mark.parametrize("tensors,why", [
    ({LDM + "label_emb.0.0.weight": (8, 2560)}, "SDXL refiner"),
    ({"first_stage_model.decoder.conv_in.weight": (8, 4, 3, 3)}, "no Stable Diffusion UNet found"),
    ({LDM + SD15_CROSS: (8, 4096)}, "cross-attention 4096 wide"),
])
def test_unknown_models_are_clear_errors(tmp_path, tensors, why):
    with pytest.raises(ValueError, match=why):
        checkpoints.architecture_of(_file(tmp_path, tensors))


def test_a_damaged_file_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(ValueError, match="not a readable .safetensors file"):
        checkpoints.architecture_of(str(path))


def test_tune_takes_a_checkpoint_file(tmp_path, capsys, monkeypatch):
    path = _file(tmp_path, {LDM + SD15_CROSS: (8, 768)}, "my_model.safetensors")
    assert checkpoints.is_checkpoint_file(path) and not checkpoints.is_checkpoint_file(str(tmp_path))
    # The real detection says sd15; the harvest then runs the tiny architecture, which a CPU harvests quickly.
    monkeypatch.setattr(checkpoints, "architecture_of", lambda p: "tiny" if checkpoints._shapes(p) else None)
    assert tune_main(["--model", path, "--dry-run", "--ops", "group_norm"]) == 0
    out = capsys.readouterr().out
    assert f"{path}: tiny architecture" in out and "group_norm|" in out

    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 16)
    monkeypatch.undo()
    assert tune_main(["--model", str(broken), "--dry-run"]) == 2
    assert "not a readable .safetensors file" in capsys.readouterr().err
