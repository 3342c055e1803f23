"""Drives a real AUTOMATIC1111 checkout without its server, its downloads or any model file: for
check_in_a1111.py and bench/bench_a1111.py, never loaded by the webui itself (only scripts/, install.py and
preload.py are).

- random checkpoints of the webui's own model configs (configs/v1-inference.yaml for SD1.5,
  repositories/generative-models/configs/inference/sd_xl_base.yaml for SDXL), written as .safetensors into the
  webui's models folder so that its own loading path (sd_models.reload_model_weights) runs;
- the files transformers asks the Hub for "openai/clip-vit-large-patch14" (its config and CLIP's BPE
  tokenizer, from the vocabulary open_clip ships), in an offline Hugging Face cache: the text encoder's weights come
  from the checkpoint, as in the webui;
- the webui imported and initialized the way webui.py does (modules.initialize), this extension installed
  in its extensions folder as a user would (a symlink), its scripts loaded by the webui's own loader;
- txt2img through modules.processing.process_images.
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {"sd15": "configs/v1-inference.yaml",
           "sdxl": "repositories/generative-models/configs/inference/sd_xl_base.yaml"}
CLIP_L = "openai/clip-vit-large-patch14"
# The text half of CLIP ViT-L/14's config.json (the vision half is never built by the webui).
CLIP_L_CONFIG = {
    "architectures": ["CLIPModel"], "model_type": "clip", "projection_dim": 768, "logit_scale_init_value": 2.6592,
    "text_config": {"model_type": "clip_text_model", "vocab_size": 49408, "hidden_size": 768,
                    "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                    "max_position_embeddings": 77, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
                    "projection_dim": 768, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1},
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                      "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": 224, "patch_size": 14,
                      "projection_dim": 768, "hidden_act": "quick_gelu"},
}


def offline_clip_cache(hf_home: str) -> None:
    """A Hugging Face cache at hf_home holding what the webui's FrozenCLIPEmbedder asks the Hub for, and the
    environment that keeps transformers offline. The tokenizer is CLIP's BPE as open_clip ships it. Call it before
    anything imports transformers (which reads HF_HOME once)."""
    os.environ.update(HF_HOME=hf_home, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    import open_clip.tokenizer as oc

    snapshot = os.path.join(hf_home, "hub", "models--" + CLIP_L.replace("/", "--"), "snapshots", "0" * 40)
    os.makedirs(snapshot, exist_ok=True)
    repo = os.path.dirname(os.path.dirname(snapshot))
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write("0" * 40)
    vocab = dict(oc.SimpleTokenizer().encoder)  # open_clip names CLIP's two special tokens differently
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = vocab.pop("<start_of_text>"), vocab.pop("<end_of_text>")
    merges = gzip.open(oc.default_bpe()).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    files = {
        "config.json": json.dumps(CLIP_L_CONFIG),
        "vocab.json": json.dumps(vocab),
        "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n",
        "tokenizer_config.json": json.dumps({"model_max_length": 77, "do_lower_case": True,
                                             "unk_token": "<|endoftext|>", "bos_token": "<|startoftext|>",
                                             "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}),
        "special_tokens_map.json": json.dumps({"unk_token": "<|endoftext|>", "bos_token": "<|startoftext|>",
                                               "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}),
    }
    for name, text in files.items():
        with open(os.path.join(snapshot, name), "w") as f:
            f.write(text)
    # The webui's loader asks for every file a tokenizer may have and goes online for a missing one.
    from transformers import CLIPTokenizerFast

    fast = CLIPTokenizerFast(os.path.join(snapshot, "vocab.json"), os.path.join(snapshot, "merges.txt"))
    fast.backend_tokenizer.save(os.path.join(snapshot, "tokenizer.json"))


def webui_argv(data_dir: str, device: str) -> list[str]:
    """The webui's command line: no server, no downloads, its data (models, extensions, config) under data_dir."""
    argv = ["webui.py", "--skip-torch-cuda-test", "--skip-load-model-at-start", "--no-download-sd-model",
            "--skip-version-check", "--skip-prepare-environment", "--data-dir", data_dir, "--no-hashing"]
    if device == "cpu":
        argv += ["--use-cpu", "all", "--no-half", "--no-half-vae", "--precision", "full"]
    return argv


def install_extension(data_dir: str) -> str:
    """This extension in the webui's extensions folder, as a user installs it (a symlink)."""
    extensions = os.path.join(data_dir, "extensions")
    os.makedirs(extensions, exist_ok=True)
    link = os.path.join(extensions, "rocm_sd")
    if not os.path.islink(link):
        os.symlink(HERE, link)
    return link


def start_webui(webui: str, data_dir: str, device: str):
    """Import and initialize the webui at `webui` as webui.py does, without its server; returns its `modules`."""
    os.makedirs(os.path.join(data_dir, "models", "Stable-diffusion"), exist_ok=True)
    install_extension(data_dir)
    os.chdir(webui)
    sys.path.insert(0, webui)
    sys.argv = webui_argv(data_dir, device)
    from modules import initialize

    initialize.imports()
    initialize.check_versions()
    initialize.initialize()
    import modules
    from modules import shared

    shared.opts.live_previews_enable = False  # its "Approx NN" previewer would download a model

    return modules


# ---- random checkpoints ------------------------------------------------------------------------------------

def _model_parameters(webui: str, arch: str):
    """(name, shape) of every parameter of the webui's model for `arch`, built from the webui's own config with its
    Linear / Conv2d weights on the meta device (the webui's own InitializeOnMeta: no memory for them)."""
    from omegaconf import OmegaConf
    from ldm.util import instantiate_from_config
    from modules import sd_disable_initialization

    config = OmegaConf.load(os.path.join(webui, CONFIGS[arch]))
    with sd_disable_initialization.DisableInitialization(), sd_disable_initialization.InitializeOnMeta():
        model = instantiate_from_config(config.model)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def _random_tensor(torch, name: str, shape: tuple, seed: int):
    """Deterministic per name: weights ~ N(0, 1/fan_in), norm scales ~ 1 + N(0, 0.05), biases ~ N(0, 0.02)."""
    g = torch.Generator().manual_seed(seed ^ zlib.crc32(name.encode()))
    t = torch.randn(shape, generator=g)
    if len(shape) >= 2:
        fan_in = 1
        for s in shape[1:]:
            fan_in *= s
        return t / fan_in ** 0.5
    if name.endswith("weight") and any(k in name for k in ("norm", "ln_", "layer_norm", "ln.")):
        return 1 + 0.05 * t
    return 0.02 * t


def write_random_checkpoint(webui: str, arch: str, path: str, dtype: str = "F32", seed: int = 0) -> str:
    """A .safetensors checkpoint of random weights for the webui's `arch` model, written tensor by tensor (an SDXL
    checkpoint is 14 GB in fp32: it never is in memory whole). Kept when it exists already."""
    import torch

    if os.path.exists(path):
        return path
    params = _model_parameters(webui, arch)
    torch_dtype, size = {"F32": (torch.float32, 4), "F16": (torch.float16, 2)}[dtype]
    header, offset = {"__metadata__": {"format": "pt", "rocm_sd": f"random {arch} seed {seed}"}}, 0
    for name, shape in params:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n * size]}
        offset += n * size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for name, shape in params:
            f.write(_random_tensor(torch, name, shape, seed).to(torch_dtype).contiguous().numpy().tobytes())
    os.replace(tmp, path)
    return path


def load_checkpoint(modules, path: str):
    """The checkpoint at `path` loaded through the webui's own path (as picking it in the checkpoint list does)."""
    sd_models, shared = modules.sd_models, modules.shared
    sd_models.list_models()
    info = sd_models.get_closet_checkpoint_match(os.path.basename(path))
    if info is None:
        raise RuntimeError(f"the webui does not list {path}")
    shared.opts.sd_model_checkpoint = info.title
    sd_models.reload_model_weights(info=info)
    return shared.sd_model


# ---- generation --------------------------------------------------------------------------------------------

def select_optimization(modules, title: str) -> str:
    """Set Settings > Optimizations > Cross attention optimization, as the settings page does (its onchange
    re-hijacks the loaded model). Returns the name the webui applied."""
    modules.shared.opts.set("cross_attention_optimization", title)
    return modules.sd_hijack.current_optimizer.name if modules.sd_hijack.current_optimizer else "none"


def txt2img(modules, size: int, steps: int, seed: int = 1234, prompt: str = "a photo of a red cat",
            batch_size: int = 1, hires: bool = False, sampler: str = "Euler", tiling: bool = False):
    """process_images(StableDiffusionProcessingTxt2Img(...)) as the txt2img tab runs it (no saving). `tiling` is
    the tab's "Tiling" checkbox: process_images hands it to sd_hijack's apply_circular, which sets
    padding_mode="circular" on the model's convolutions for this image (and "zeros" again for the next without)."""
    from modules import processing, shared

    kwargs = dict(enable_hr=True, hr_scale=1.5, hr_upscaler="Latent", denoising_strength=0.6,
                  hr_second_pass_steps=steps) if hires else {}
    p = processing.StableDiffusionProcessingTxt2Img(
        sd_model=shared.sd_model, prompt=prompt, negative_prompt="blurry", seed=seed, subseed=-1, steps=steps,
        width=size, height=size, cfg_scale=7.0, sampler_name=sampler, batch_size=batch_size, n_iter=1,
        do_not_save_samples=True, do_not_save_grid=True, tiling=tiling, **kwargs)
    try:
        return processing.process_images(p)
    finally:
        p.close()
