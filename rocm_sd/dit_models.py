"""Random-weight diffusion-transformer pipelines (Stable Diffusion 3 / 3.5, FLUX.1) from their published configs.

Same shapes and FLOPs as the released models; no weights are downloaded. The 8-12 B parameter transformers and
T5-XXL are built directly on the target device in the target dtype: initialising them on the host takes minutes.

Architectures: sd3 (SD3 Medium), sd35m (SD3.5 Medium: dual attention, RMSNorm of Q and K), sd35 (SD3.5 Large),
sd35-turbo (SD3.5 Large Turbo: same network, 4 steps, no CFG), flux (FLUX.1-dev), flux-schnell, and tiny-sd3 /
tiny-flux: the same block types at toy width for CPU tests.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch, diffusers and transformers are imported by the functions that build or run a model (models.py says why).

# Text encoders as released: CLIP-L and OpenCLIP bigG with projections (SD3), T5 v1.1 XXL's encoder.
CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
              max_position_embeddings=77, hidden_act="quick_gelu", vocab_size=49408, projection_dim=768)
CLIP_G = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
              max_position_embeddings=77, hidden_act="gelu", vocab_size=49408, projection_dim=1280)
T5_XXL = dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, feed_forward_proj="gated-gelu",
              vocab_size=32128, layer_norm_epsilon=1e-6, relative_attention_num_buckets=32)
TINY_CLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=77, hidden_act="quick_gelu", vocab_size=1000, projection_dim=32)
TINY_T5 = dict(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, feed_forward_proj="gated-gelu",
               vocab_size=1000, layer_norm_epsilon=1e-6, relative_attention_num_buckets=8)
# The 16-channel VAE of SD3 and Flux (no quant convs); scaling and shift differ per family.
VAE16 = dict(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
             up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=16, sample_size=1024,
             use_quant_conv=False, use_post_quant_conv=False)
TINY_VAE16 = dict(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=16, norm_num_groups=8,
                  sample_size=64, use_quant_conv=False, use_post_quant_conv=False)
SD3_VAE, FLUX_VAE = dict(scaling_factor=1.5305, shift_factor=0.0609), dict(scaling_factor=0.3611, shift_factor=0.1159)
SD3_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0)
FLUX_DEV_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_image_seq_len=256,
                          max_image_seq_len=4096, base_shift=0.5, max_shift=1.15)
FLUX_SCHNELL_SCHEDULER = dict(num_train_timesteps=1000, shift=1.0)


@dataclass(frozen=True)
class TransformerArchitecture:
    family: str                     # "sd3" or "flux": the pipeline class and how prompts are encoded
    transformer: dict
    vae: dict
    text: dict                      # CLIP-L
    t5: dict
    text_2: dict | None = None      # SD3's OpenCLIP bigG
    size: int = 1024
    steps: int = 28                 # the model card's default
    guidance: float = 7.0           # SD3: CFG scale (> 1: batch 2); Flux dev: the distilled guidance embedding
    t5_tokens: int = 256            # max_sequence_length
    scheduler: dict = field(default_factory=dict)


def _sd3(layers: int, heads: int, pos_embed_max_size: int = 192, **extra) -> dict:
    return dict(sample_size=128, patch_size=2, in_channels=16, num_layers=layers, attention_head_dim=64,
                num_attention_heads=heads, joint_attention_dim=4096, caption_projection_dim=64 * heads,
                pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=pos_embed_max_size, **extra)


def _flux(guidance: bool) -> dict:
    return dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=guidance,
                axes_dims_rope=(16, 56, 56))


ARCHITECTURES = {
    "sd3": TransformerArchitecture("sd3", _sd3(24, 24), dict(VAE16, **SD3_VAE), CLIP_L, T5_XXL, CLIP_G,
                                   scheduler=SD3_SCHEDULER),
    "sd35m": TransformerArchitecture("sd3", _sd3(24, 24, 384, qk_norm="rms_norm",
                                                 dual_attention_layers=tuple(range(13))),
                                     dict(VAE16, **SD3_VAE), CLIP_L, T5_XXL, CLIP_G, steps=40, guidance=4.5,
                                     scheduler=SD3_SCHEDULER),
    "sd35": TransformerArchitecture("sd3", _sd3(38, 38, qk_norm="rms_norm"), dict(VAE16, **SD3_VAE), CLIP_L, T5_XXL,
                                    CLIP_G, steps=28, guidance=3.5, scheduler=SD3_SCHEDULER),
    "sd35-turbo": TransformerArchitecture("sd3", _sd3(38, 38, qk_norm="rms_norm"), dict(VAE16, **SD3_VAE), CLIP_L,
                                          T5_XXL, CLIP_G, steps=4, guidance=0.0, scheduler=SD3_SCHEDULER),
    "flux": TransformerArchitecture("flux", _flux(True), dict(VAE16, **FLUX_VAE), CLIP_L, T5_XXL, steps=28,
                                    guidance=3.5, t5_tokens=512, scheduler=FLUX_DEV_SCHEDULER),
    "flux-schnell": TransformerArchitecture("flux", _flux(False), dict(VAE16, **FLUX_VAE), CLIP_L, T5_XXL, steps=4,
                                            guidance=0.0, t5_tokens=256, scheduler=FLUX_SCHNELL_SCHEDULER),
    "tiny-sd3": TransformerArchitecture(
        "sd3", dict(sample_size=16, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=8,
                    num_attention_heads=4, joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=64,
                    out_channels=16, pos_embed_max_size=16, qk_norm="rms_norm", dual_attention_layers=(0,)),
        dict(TINY_VAE16, **SD3_VAE), TINY_CLIP, TINY_T5, TINY_CLIP, size=64, steps=4, t5_tokens=16,
        scheduler=SD3_SCHEDULER),
    "tiny-flux": TransformerArchitecture(
        "flux", dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=16,
                     num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
                     axes_dims_rope=(4, 6, 6)),
        dict(TINY_VAE16, **FLUX_VAE), TINY_CLIP, TINY_T5, size=64, steps=4, guidance=3.5, t5_tokens=16,
        scheduler=FLUX_DEV_SCHEDULER),
}


@contextmanager
def _building_on(device, dtype):
    """Parameters created directly on `device` in `dtype` (no host initialisation, no cast copy)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def build_pipeline(arch: str, device="cpu", dtype: torch.dtype | None = None, seed: int = 0):
    """A StableDiffusion3Pipeline or FluxPipeline of `arch` with random weights, built on `device` in `dtype`
    (default float32)."""
    import torch
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel,
                           SD3Transformer2DModel, StableDiffusion3Pipeline)
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    spec = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    if str(device).startswith("cuda"):
        torch.cuda.manual_seed_all(seed)
    scheduler = FlowMatchEulerDiscreteScheduler(**spec.scheduler)
    with _building_on(device, dtype or torch.float32):
        vae = AutoencoderKL(**spec.vae)
        t5 = T5EncoderModel(T5Config(**spec.t5))
        if spec.family == "sd3":
            pipe = StableDiffusion3Pipeline(
                transformer=SD3Transformer2DModel(**spec.transformer), scheduler=scheduler, vae=vae,
                text_encoder=CLIPTextModelWithProjection(CLIPTextConfig(**spec.text)), tokenizer=None,
                text_encoder_2=CLIPTextModelWithProjection(CLIPTextConfig(**spec.text_2)), tokenizer_2=None,
                text_encoder_3=t5, tokenizer_3=None)
        else:
            pipe = FluxPipeline(transformer=FluxTransformer2DModel(**spec.transformer), scheduler=scheduler, vae=vae,
                                text_encoder=CLIPTextModel(CLIPTextConfig(**spec.text)), tokenizer=None,
                                text_encoder_2=t5, tokenizer_2=None)
    for model in pipe.components.values():
        if isinstance(model, torch.nn.Module):
            model.eval()  # T5 is built with dropout on: in training mode its output is random
    pipe.set_progress_bar_config(disable=True)
    pipe.rocm_sd_architecture = arch  # prompt_kwargs' T5 length and guidance
    return pipe


def _encode(pipe, prompt: str, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt_embeds, pooled_prompt_embeds) as the pipelines' encode_prompt builds them, from hashed token ids."""
    import torch

    with torch.no_grad():
        return _encode_ids(pipe, prompt, tokens)


def _encode_ids(pipe, prompt: str, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    from .prompt_ids import input_device, prompt_token_ids

    def ids(encoder, length=77):
        return prompt_token_ids(prompt, encoder.config.vocab_size, length).to(input_device(pipe, encoder))

    if hasattr(pipe, "text_encoder_3"):  # SD3: both CLIPs' penultimate states, zero-padded to T5's width, then T5's
        states, pooled = [], []
        for encoder in (pipe.text_encoder, pipe.text_encoder_2):
            out = encoder(ids(encoder), output_hidden_states=True)
            states.append(out.hidden_states[-2])
            pooled.append(out.text_embeds)
        t5 = pipe.text_encoder_3(ids(pipe.text_encoder_3, tokens))[0]
        clip = torch.cat(states, dim=-1)
        clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return torch.cat([clip, t5], dim=-2), torch.cat(pooled, dim=-1)
    pooled = pipe.text_encoder(ids(pipe.text_encoder)).pooler_output
    return pipe.text_encoder_2(ids(pipe.text_encoder_2, tokens))[0], pooled


def prompt_kwargs(pipe, prompt: str, negative: str = "", batch: int = 1) -> dict:
    """Pipeline keyword arguments for `batch` images of `prompt` on a pipeline build_pipeline made: embeddings, the
    model card's guidance, the T5 length. SD3 runs CFG against `negative` where the guidance scale is above 1 (its
    embeddings are always given: a caller may change the scale); Flux dev takes its guidance as an embedding."""
    spec = ARCHITECTURES[pipe.rocm_sd_architecture]

    def rep(t):
        return t.repeat(batch, *([1] * (t.dim() - 1)))

    embeds, pooled = _encode(pipe, prompt, spec.t5_tokens)
    kwargs = {"prompt_embeds": rep(embeds), "pooled_prompt_embeds": rep(pooled), "guidance_scale": spec.guidance,
              "max_sequence_length": spec.t5_tokens}
    if spec.family == "sd3":
        negative_embeds, negative_pooled = _encode(pipe, negative, spec.t5_tokens)
        kwargs.update(negative_prompt_embeds=rep(negative_embeds), negative_pooled_prompt_embeds=rep(negative_pooled))
    return kwargs
