"""Random-weight Stable Diffusion pipelines built from configs (no download), for the demo, tests
and benchmarks. Random weights cost the same FLOPs as trained ones; users pass their own models."""
from __future__ import annotations

import hashlib

import torch

# name -> (UNet kwargs, VAE kwargs, CLIP text kwargs, default image size)
ARCHITECTURES = {
    # SD1.5: UNet 320/640/1280/1280, 8 heads, cross-attention 768; VAE 128/256/512/512; CLIP-L text.
    "sd15": (
        dict(sample_size=64, cross_attention_dim=768, attention_head_dim=8),
        dict(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
             up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4, sample_size=512),
        dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
             max_position_embeddings=77, hidden_act="quick_gelu", vocab_size=49408),
        512,
    ),
    # The same blocks at toy width, for CPU tests and the CPU demo.
    "tiny": (
        dict(sample_size=32, block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8,
             down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
             cross_attention_dim=32, attention_head_dim=4),
        dict(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
             up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4, norm_num_groups=8,
             sample_size=64),
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=77, hidden_act="quick_gelu", vocab_size=1000),
        64,
    ),
}


def build_sd_pipeline(arch: str = "sd15", device="cpu", dtype=torch.float32, seed: int = 0):
    """A StableDiffusionPipeline of the given architecture with random weights (Euler scheduler)."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    unet_kw, vae_kw, text_kw, _ = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    pipe = StableDiffusionPipeline(
        vae=AutoencoderKL(**vae_kw), text_encoder=CLIPTextModel(CLIPTextConfig(**text_kw)), tokenizer=None,
        unet=UNet2DConditionModel(**unet_kw),
        scheduler=EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear"),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device, dtype)


def default_size(arch: str) -> int:
    return ARCHITECTURES[arch][3]


def prompt_token_ids(prompt: str, vocab_size: int, length: int = 77) -> torch.Tensor:
    """Deterministic token ids for a prompt (no tokenizer files can be downloaded here): one id per word
    from its hash, between CLIP's begin and end markers, padded with the end marker."""
    bos, eos = vocab_size - 2, vocab_size - 1
    words = [int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little") % (vocab_size - 2)
             for w in prompt.lower().split()][: length - 2]
    ids = [bos] + words + [eos] * (length - 1 - len(words))
    return torch.tensor([ids])


@torch.no_grad()
def encode_prompt(pipe, prompt: str) -> torch.Tensor:
    te = pipe.text_encoder
    ids = prompt_token_ids(prompt, te.config.vocab_size).to(te.device)
    return te(ids)[0]
