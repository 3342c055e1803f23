"""Which architecture a single-file checkpoint has (the `.safetensors` files ComfyUI and AUTOMATIC1111 load).

ComfyUI and A1111 users hold models as one file, not as diffusers folders. Tuning needs only the model's
shapes, so `python -m rocm_sd.tune --model model.safetensors` reads the file's tensor names and shapes
(its header: no weight is loaded) and tunes the matching architecture of rocm_sd.models, whose random
weights cost the same and pick the same kernels. Recognised layouts: the original (LDM) checkpoint
(`model.diffusion_model.*`, with or without that prefix: ComfyUI's UNet-only files) and diffusers' UNet.
"""
from __future__ import annotations

import os

CHECKPOINT_SUFFIXES = (".safetensors",)
# The single-file formats ComfyUI and A1111 load. A .ckpt is a pickle, which can run code when it is loaded: only
# its header-only .safetensors counterpart is read here.
SINGLE_FILE_SUFFIXES = CHECKPOINT_SUFFIXES + (".ckpt",)

# (key suffix, which dimension to read) -> {its size: architecture}: the cross-attention width tells SD1.x (768,
# CLIP-L) from SD2.x (1024, OpenCLIP-H); SDXL base has a 2816-wide class embedding (pooled text + sizes).
_SDXL_EMBEDDING = ("label_emb.0.0.weight", "add_embedding.linear_1.weight")
_CROSS_ATTENTION = ("input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight",
                    "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight")
_BY_CONTEXT_WIDTH = {768: "sd15", 1024: "sd21"}


def is_checkpoint_file(model: str) -> bool:
    return model.lower().endswith(CHECKPOINT_SUFFIXES) and os.path.isfile(model)


def _shapes(path: str) -> dict[str, list[int]]:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return {key: list(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: not a readable .safetensors file ({type(error).__name__}: {error})") from None


def architecture_of(path: str) -> str:
    """'sd15', 'sd21' or 'sdxl' for the checkpoint at `path`; ValueError naming what is not recognised."""
    shapes = _shapes(path)

    def find(suffixes: tuple[str, ...]) -> list[int] | None:
        return next((shape for key, shape in shapes.items() if key.endswith(suffixes)), None)

    embedding, context = find(_SDXL_EMBEDDING), find(_CROSS_ATTENTION)
    if embedding is None and context is None:
        raise ValueError(f"{path}: no Stable Diffusion UNet found ({len(shapes)} tensors, none named like a UNet's "
                         "first cross-attention)")
    try:
        return architecture_for(context[-1] if context else None, embedding[-1] if embedding else None)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def architecture_for(context_width: int | None, class_embedding_width: int | None = None) -> str:
    """rocm_sd.models' architecture for a UNet with this cross-attention width and class embedding input
    width (None: no class embedding); ValueError for other models."""
    if class_embedding_width is not None:
        if class_embedding_width == 2816:
            return "sdxl"
        raise ValueError(f"a class embedding {class_embedding_width} wide (SDXL base has 2816; the SDXL refiner's "
                         "2560 and other conditioned UNets are not among rocm_sd's architectures)")
    if context_width not in _BY_CONTEXT_WIDTH:
        raise ValueError(f"cross-attention {context_width} wide; rocm_sd knows 768 (SD1.x), 1024 (SD2.x) and SDXL")
    return _BY_CONTEXT_WIDTH[context_width]
