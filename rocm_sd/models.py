"""Random-weight Stable Diffusion pipelines built from configs (no download), for the demo, tests
and benchmarks. Random weights cost the same FLOPs as trained ones; users pass their own models.

Architectures: sd15, sd21 (StableDiffusionPipeline), sdxl (StableDiffusionXLPipeline), and tiny /
tiny-xl, the same block types at toy width for CPU tests and the CPU demo; the diffusion transformers (sd3, sd35m,
sd35, sd35-turbo, flux, flux-schnell, tiny-sd3, tiny-flux) from rocm_sd/dit_models.py.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import checkpoints, dit_models

if TYPE_CHECKING:
    import torch

# torch, diffusers and transformers are imported by the functions that build or run a model: the architectures and
# model_problem serve the commands' argument checks, which answer before anything heavy is imported.

# CLIP text encoders (hidden size, depth, heads, MLP width, activation), as in the released models.
CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
              max_position_embeddings=77, hidden_act="quick_gelu", vocab_size=49408)
OPENCLIP_H = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=23, num_attention_heads=16,
                  max_position_embeddings=77, hidden_act="gelu", vocab_size=49408)
OPENCLIP_BIGG = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                     max_position_embeddings=77, hidden_act="gelu", vocab_size=49408, projection_dim=1280)
TINY_CLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=77, hidden_act="quick_gelu", vocab_size=1000)
SD_VAE = dict(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
              up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4)
TINY_VAE = dict(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4, norm_num_groups=8)


@dataclass(frozen=True)
class Architecture:
    unet: dict
    vae: dict
    text: dict
    size: int                       # default image height and width
    text_2: dict | None = None      # SDXL's second text encoder (with projection): selects the XL pipeline
    scheduler: dict = field(default_factory=dict)


ARCHITECTURES = {
    # SD1.5: UNet 320/640/1280/1280, 8 heads, cross-attention 768; VAE 128/256/512/512; CLIP-L text.
    "sd15": Architecture(unet=dict(sample_size=64, cross_attention_dim=768, attention_head_dim=8),
                         vae=dict(SD_VAE, sample_size=512), text=CLIP_L, size=512),
    # SD2.1 (768-v): head dims 64 (5/10/20/20 heads), linear projections, cross-attention 1024, OpenCLIP-H.
    "sd21": Architecture(unet=dict(sample_size=96, cross_attention_dim=1024, attention_head_dim=(5, 10, 20, 20),
                                   use_linear_projection=True, upcast_attention=True),
                         vae=dict(SD_VAE, sample_size=768), text=OPENCLIP_H, size=768,
                         scheduler=dict(prediction_type="v_prediction")),
    # SDXL base: 320/640/1280 with 1/2/10 transformer layers, cross-attention 2048 (CLIP-L + bigG),
    # text_time conditioning; the VAE as in the fp16-safe SDXL VAE (no fp32 upcast).
    "sdxl": Architecture(unet=dict(sample_size=128, block_out_channels=(320, 640, 1280),
                                   down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                                   up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                                   transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
                                   cross_attention_dim=2048, use_linear_projection=True,
                                   addition_embed_type="text_time", addition_time_embed_dim=256,
                                   projection_class_embeddings_input_dim=2816),
                         vae=dict(SD_VAE, sample_size=1024, scaling_factor=0.13025, force_upcast=False),
                         text=CLIP_L, text_2=OPENCLIP_BIGG, size=1024),
    "tiny": Architecture(unet=dict(sample_size=32, block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8,
                                   down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                   up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                   attention_head_dim=4),
                         vae=dict(TINY_VAE, sample_size=64), text=TINY_CLIP, size=64),
    "tiny-xl": Architecture(unet=dict(sample_size=32, block_out_channels=(32, 64), layers_per_block=1,
                                      norm_num_groups=8, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                      up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
                                      transformer_layers_per_block=(1, 2), attention_head_dim=(2, 4),
                                      cross_attention_dim=64, use_linear_projection=True,
                                      addition_embed_type="text_time", addition_time_embed_dim=8,
                                      projection_class_embeddings_input_dim=6 * 8 + 32),
                            vae=dict(TINY_VAE, sample_size=64, force_upcast=False), text=TINY_CLIP,
                            text_2=dict(TINY_CLIP, projection_dim=32), size=64),
}


UNET_ARCHITECTURES = tuple(ARCHITECTURES)
ARCHITECTURES.update(dit_models.ARCHITECTURES)


def is_transformer(arch: str) -> bool:
    """Whether `arch` is a diffusion transformer (SD3 / SD3.5, Flux) rather than a UNet model."""
    return arch in dit_models.ARCHITECTURES


def gpu_dtype(arch: str) -> torch.dtype:
    """The dtype a GPU runs `arch` in: bf16 for the diffusion transformers (as released), fp16 for the UNets."""
    import torch

    return torch.bfloat16 if is_transformer(arch) else torch.float16


def default_steps(arch: str, fallback: int = 50) -> int:
    """The model card's number of steps for a diffusion transformer (Turbo and schnell: 4), else `fallback`."""
    return dit_models.ARCHITECTURES[arch].steps if is_transformer(arch) else fallback


def denoiser(pipe):
    """The pipeline's diffusion model: its UNet, or its transformer (SD3, Flux)."""
    return pipe.unet if getattr(pipe, "unet", None) is not None else pipe.transformer


def build_sd_pipeline(arch: str = "sd15", device="cpu", dtype: torch.dtype | None = None, seed: int = 0):
    """A StableDiffusionPipeline (or StableDiffusionXLPipeline) of the given architecture with random
    weights and an Euler scheduler, in `dtype` (default float32); for a diffusion transformer,
    dit_models.build_pipeline's."""
    if arch in dit_models.ARCHITECTURES:
        return dit_models.build_pipeline(arch, device, dtype, seed)
    import torch
    from diffusers import (AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline,
                           UNet2DConditionModel)
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    spec = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    # steps_offset=1 as the published SD configs have it (diffusers warns about 0 and prints the whole config);
    # with linspace spacing it does not move a single timestep.
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       steps_offset=1, **spec.scheduler)
    # On the meta device (shapes only: the tuner's listing on a CPU) the weights are made there, not initialised on
    # the host first.
    with torch.device("meta") if torch.device(device).type == "meta" else contextlib.nullcontext():
        common = dict(vae=AutoencoderKL(**spec.vae), text_encoder=CLIPTextModel(CLIPTextConfig(**spec.text)),
                      tokenizer=None, unet=UNet2DConditionModel(**spec.unet), scheduler=scheduler)
        text_2 = None if spec.text_2 is None else CLIPTextModelWithProjection(CLIPTextConfig(**spec.text_2))
    if text_2 is None:
        pipe = StableDiffusionPipeline(**common, safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)
    else:
        pipe = StableDiffusionXLPipeline(**common, text_encoder_2=text_2, tokenizer_2=None, add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device, dtype or torch.float32)


def default_size(arch: str) -> int:
    return ARCHITECTURES[arch].size


MODEL_INDEX = "model_index.json"  # what makes a folder a diffusers pipeline: from_pretrained reads it first


def model_problem(model: str, checkpoint_files: bool = False) -> str | None:
    """Why `model` names no model a command can use, or None. load_pipeline takes an architecture name (random
    weights) or a local diffusers model folder; `python -m rocm_sd.tune` also takes single-file checkpoints
    (`checkpoint_files`: it tunes their architecture's shapes). Reads no weights: commands check --model with it
    before they build anything."""
    if model in ARCHITECTURES or os.path.isfile(os.path.join(model, MODEL_INDEX)):
        return None
    if checkpoint_files and checkpoints.is_checkpoint_file(model):
        return None
    return f"{model!r} is {_what_it_is(model)}; accepted: {_accepted_models(checkpoint_files)}" + (
        _conversion_hint(checkpoint_files) if model.lower().endswith(checkpoints.SINGLE_FILE_SUFFIXES) else "")


def _what_it_is(model: str) -> str:
    if os.path.isdir(model):
        return f"a folder without {MODEL_INDEX}, not a diffusers model"
    if not os.path.isfile(model):
        return "neither an architecture nor an existing file or folder"
    if model.lower().endswith(checkpoints.SINGLE_FILE_SUFFIXES):
        return "a single-file checkpoint"
    return "a file, not a diffusers model folder"


def _accepted_models(checkpoint_files: bool) -> str:
    kinds = [f"an architecture ({', '.join(sorted(ARCHITECTURES))})", "a local diffusers model folder"]
    if checkpoint_files:
        kinds.append(f"a {' or '.join(checkpoints.CHECKPOINT_SUFFIXES)} checkpoint file")
    return f"{', '.join(kinds[:-1])} or {kinds[-1]}"


def _conversion_hint(checkpoint_files: bool) -> str:
    tune = "" if checkpoint_files else (f"; `python -m rocm_sd.tune` takes {'/'.join(checkpoints.CHECKPOINT_SUFFIXES)} "
                                        "files as they are, tuning their architecture's shapes")
    return f" (diffusers' from_single_file(...).save_pretrained(folder) makes a diffusers folder of one{tune})"


def load_pipeline(model: str, device, dtype):
    """An architecture name from ARCHITECTURES (random weights) or a local diffusers model folder."""
    if model in ARCHITECTURES:
        return build_sd_pipeline(model, device, dtype)
    problem = model_problem(model)
    if problem:
        raise ValueError(f"--model {problem}")
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(model, torch_dtype=dtype, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def encode_prompt(pipe, prompt: str) -> torch.Tensor:
    """The first text encoder's last hidden state for `prompt` (SD1.x/2.x conditioning)."""
    import torch

    from .prompt_ids import input_device, prompt_token_ids

    te = pipe.text_encoder
    ids = prompt_token_ids(prompt, te.config.vocab_size).to(input_device(pipe, te))
    with torch.no_grad():
        return te(ids)[0]


def _encode_xl(pipe, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    # As StableDiffusionXLPipeline.encode_prompt: both encoders' penultimate hidden states side by side,
    # and the second encoder's projected pooled output.
    import torch

    from .prompt_ids import input_device, prompt_token_ids

    states = []
    with torch.no_grad():
        for te in (pipe.text_encoder, pipe.text_encoder_2):
            out = te(prompt_token_ids(prompt, te.config.vocab_size).to(input_device(pipe, te)),
                     output_hidden_states=True)
            states.append(out.hidden_states[-2])
        return torch.cat(states, dim=-1), out.text_embeds


def conditioning(pipe, prompts: list[str], negative: str = "") -> dict:
    """Pipeline keyword arguments for one image per prompt: the prompts themselves when the pipeline has
    a tokenizer (a real model), else embeddings of hashed token ids (random-weight architectures). The guidance is
    the caller's."""
    import torch

    if getattr(pipe, "tokenizer", None) is not None:
        return {"prompt": list(prompts), "negative_prompt": [negative] * len(prompts)}
    per_prompt = [prompt_kwargs(pipe, p, negative) for p in prompts]
    return {key: torch.cat([kw[key] for kw in per_prompt]) for key, value in per_prompt[0].items()
            if isinstance(value, torch.Tensor)}


def prompt_kwargs(pipe, prompt: str, negative: str = "", batch: int = 1) -> dict:
    """Pipeline keyword arguments conditioning on `prompt` (CFG against `negative`), `batch` images."""
    if getattr(pipe, "rocm_sd_architecture", None) in dit_models.ARCHITECTURES:
        return dit_models.prompt_kwargs(pipe, prompt, negative, batch)

    def rep(t):
        return t.repeat(batch, *([1] * (t.dim() - 1)))

    if getattr(pipe, "text_encoder_2", None) is None:
        return {"prompt_embeds": rep(encode_prompt(pipe, prompt)),
                "negative_prompt_embeds": rep(encode_prompt(pipe, negative))}
    embeds, pooled = _encode_xl(pipe, prompt)
    negative_embeds, negative_pooled = _encode_xl(pipe, negative)
    return {"prompt_embeds": rep(embeds), "negative_prompt_embeds": rep(negative_embeds),
            "pooled_prompt_embeds": rep(pooled), "negative_pooled_prompt_embeds": rep(negative_pooled)}
