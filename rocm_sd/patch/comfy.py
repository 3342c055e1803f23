"""Patches for models driven by ComfyUI's ModelPatcher: ComfyUI itself and Forge (which vendors it).

What the ComfyUI node and the A1111 extension's Forge path share (docs/design.md, convention 10: one copy of
the patch logic): which modules of ComfyUI's UNet and VAE are which, kernel-backed copies of its norm
modules to install as object patches, and attention in ComfyUI's calling conventions, either as the
per-model `optimized_attention_override` or as attn1/attn2 replace patches.
"""
from __future__ import annotations

from torch import nn

from ..checkpoints import architecture_for
from ..modules.attention import heads_first, heads_last, spatial_attention
from ..ops.attention import host_call_uses_op, scaled_dot_product_attention
from .comfy_graph import install_graphs, install_step_cache
from ..modules.step_cache import ComfyStepCache
from ..modules.host_copies import conv_channels_last_copy, group_norm_copy, layer_norm_copy, upsample_copy
from ..modules.upsample import conv_foldable


def _host_casts(module) -> bool:
    """ComfyUI casts or streams this module's weights per call (low-VRAM, fp8, manual cast): its own path."""
    return bool(getattr(module, "comfy_cast_weights", False) or getattr(module, "weight_function", None)
                or getattr(module, "bias_function", None))


# ---- which modules are which in ComfyUI's models -----------------------------------------------------------

def norm_swaps(root, group_norm: bool = True, layer_norm: bool = True) -> dict[str, object]:
    """{dotted path under root: replacement} for the norms of a ComfyUI UNet or VAE.

    A GroupNorm directly followed by nn.SiLU inside an nn.Sequential is run as one fused call, with the
    SiLU replaced by Identity, except in a ResBlock's out_layers when it uses scale-shift norm (there the
    SiLU comes after the scale and shift). So are the VAE ResnetBlock's norm1 and norm2, whose forward
    applies its `swish` module right after each and nowhere else when the block has no time embedding
    (no `temb_proj`: the VAE's blocks). Every other GroupNorm, and every LayerNorm, is swapped alone.
    """
    swaps: dict[str, object] = {}
    if group_norm:
        for parent_name, parent in root.named_modules():
            scale_shift = getattr(parent, "use_scale_shift_norm", False)
            for seq_name, seq in parent.named_children():
                if not isinstance(seq, nn.Sequential) or (scale_shift and seq_name == "out_layers"):
                    continue
                path = f"{parent_name}.{seq_name}" if parent_name else seq_name
                items = list(seq.named_children())
                for (name, module), (next_name, following) in zip(items, items[1:]):
                    if isinstance(module, nn.GroupNorm) and type(following) is nn.SiLU:
                        swaps[f"{path}.{name}"] = group_norm_copy(module, "silu", _host_casts)
                        swaps[f"{path}.{next_name}"] = nn.Identity()
        for name, block in root.named_modules():
            norms = [getattr(block, n, None) for n in ("norm1", "norm2")]
            if (type(getattr(block, "swish", None)) is nn.SiLU and not hasattr(block, "temb_proj")
                    and all(isinstance(norm, nn.GroupNorm) for norm in norms)):
                prefix = f"{name}." if name else ""
                swaps[prefix + "norm1"] = group_norm_copy(norms[0], "silu", _host_casts)
                swaps[prefix + "norm2"] = group_norm_copy(norms[1], "silu", _host_casts)
                swaps[prefix + "swish"] = nn.Identity()
        for name, module in root.named_modules():
            if isinstance(module, nn.GroupNorm) and name not in swaps:
                swaps[name] = group_norm_copy(module, None, _host_casts)
    if layer_norm:
        for name, module in root.named_modules():
            if isinstance(module, nn.LayerNorm):
                swaps[name] = layer_norm_copy(module, _host_casts)
    return swaps


def upsample_swaps(root) -> dict[str, object]:
    """{dotted path: replacement} for the VAE's Upsample modules (nearest 2x interpolation, then a 3x3 `conv`
    when `with_conv`): the folded 2x2 convolution of modules/upsample.py. Weights ComfyUI casts per call take its
    own forward."""
    return {name: upsample_copy(module, _host_casts) for name, module in root.named_modules()
            if type(module).__name__ == "Upsample" and getattr(module, "with_conv", False)
            and conv_foldable(getattr(module, "conv", None))}


def conv_swaps(root, skip: dict | None = None) -> dict[str, object]:
    """{dotted path: replacement} for every 2-D convolution of a ComfyUI UNet or VAE: the same convolution on a
    channels_last view of its weight (modules/host_copies.py), so that the model's activations run NHWC. ComfyUI keeps
    its models NCHW, and on NCHW tensors cuDNN's and MIOpen's fast convolutions transpose every input, output
    and filter (bench/notes/comfyui.md). Convolutions under a
    path in `skip` (modules swapped whole, such as the folded upsamplers) are left to their owner."""
    skip = skip or {}
    return {name: conv_channels_last_copy(module, _host_casts) for name, module in root.named_modules()
            if isinstance(module, nn.Conv2d) and not any(name.startswith(owner + ".") for owner in skip)}


def model_architecture(patcher) -> str:
    """rocm_sd.models' architecture (sd15, sd21, sdxl) of a ComfyUI MODEL, from the UNet config ComfyUI detected
    for it (comfy/supported_models.py); ValueError for other models."""
    config = getattr(getattr(patcher.model, "model_config", None), "unet_config", None)
    if not config:
        raise ValueError("this MODEL carries no UNet config (not one of ComfyUI's Stable Diffusion models)")
    return architecture_for(config.get("context_dim"), config.get("adm_in_channels") or None)


# ---- attention ---------------------------------------------------------------------------------------------

def comfy_attention(q, k, v, heads, skip_reshape=False, skip_output_reshape=False):
    """ComfyUI's attention contract, unmasked (masked calls stay ComfyUI's own): (B, L, heads*D) unless
    skip_reshape (then (B, H, L, D)); output (B, L, heads*D) unless skip_output_reshape."""
    if not skip_reshape:
        q, k, v = (heads_first(t, heads) for t in (q, k, v))
    out = scaled_dot_product_attention(q, k, v)
    return out if skip_output_reshape else heads_last(out)


def attention_override(original, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
                       skip_output_reshape=False, **kwargs):
    """transformer_options["optimized_attention_override"]: rocm_sd's attention op where ops/attention.py's
    host_call_uses_op says so (a tuned choice may apply: its kernel, a CK instance or one SDPA backend), else
    ComfyUI's own function, which also runs masked calls and arguments this one does not know (a newer ComfyUI's
    GQA...). Where rocm_sd would run PyTorch's SDPA anyway, ComfyUI's own function is the better SDPA call: ComfyUI
    picks SDPA's backend order (cuDNN first on NVIDIA, faster at SD's shapes: bench/results/comfyui-h200.md) and
    costs no extra host time."""
    unknown = set(kwargs) - {"transformer_options", "_inside_attn_wrapper"}
    if unknown or not host_call_uses_op(q, q.shape[-1] if skip_reshape else q.shape[-1] // heads, mask):
        return original(q, k, v, heads, mask=mask, attn_precision=attn_precision, skip_reshape=skip_reshape,
                        skip_output_reshape=skip_output_reshape, **kwargs)
    return comfy_attention(q, k, v, heads, skip_reshape, skip_output_reshape)


def attention_replace(q, k, v, extra_options):
    """An attn1/attn2 replace patch (ComfyUI without the override): q, k, v are (B, L, heads*D), no mask."""
    return comfy_attention(q, k, v, extra_options["n_heads"])


# The VAE AttnBlock's per-instance attention function: q, k, v (B, C, H, W), one head of C channels.
vae_attention = spatial_attention


def _override_supported() -> bool:
    try:
        import comfy.ldm.modules.attention as comfy_attention_module
    except ImportError:
        return False
    return hasattr(comfy_attention_module, "wrap_attn")


def _transformer_block_keys(diffusion_model) -> list[tuple[str, int, int]]:
    """(block name, number, index) of every transformer block, as ComfyUI keys attn1/attn2 replace patches."""
    keys = []
    for block_name, attr in (("input", "input_blocks"), ("middle", "middle_block"), ("output", "output_blocks")):
        blocks = getattr(diffusion_model, attr, None)
        if blocks is None:
            continue
        numbered = [(0, blocks)] if block_name == "middle" else list(enumerate(blocks))
        for number, block in numbered:
            for layer in block:
                for index, _ in enumerate(getattr(layer, "transformer_blocks", [])):
                    keys.append((block_name, number, index))
    return keys


def patch_model_patcher(patcher, attention: bool = True, group_norm: bool = True, layer_norm: bool = True,
                        override_supported: bool | None = None, cuda_graph: bool = False,
                        channels_last: bool = False, cache: str | None = None, cache_interval: int = 3,
                        cache_threshold: float = 0.15) -> str | None:
    """Install rocm_sd on `patcher` (a clone: the caller never passes the user's own model) as object
    patches and attention patches, with channels_last the convolutions on channels_last weights (NHWC
    activations), with cuda_graph the model evaluation as a replayed graph (patch/comfy_graph.py), and with cache
    ('deepcache' / 'adaptive', as optimize()'s options; docs/step_cache.md) step caching of the UNet.
    override_supported: None to detect ComfyUI's `wrap_attn`. Returns why graphs or the step cache could not be
    installed, or None."""
    get = getattr(patcher, "get_model_object", None)  # older ComfyUI and Forge's vendored copy lack it
    diffusion_model = get("diffusion_model") if get is not None else patcher.model.diffusion_model
    swaps = norm_swaps(diffusion_model, group_norm, layer_norm)
    if channels_last:
        swaps.update(conv_swaps(diffusion_model))
    for path, module in swaps.items():
        patcher.add_object_patch(f"diffusion_model.{path}", module)
    _patch_attention(patcher, diffusion_model, attention, override_supported)
    step_cache = ComfyStepCache(cache, cache_interval, cache_threshold) if cache else None
    if cuda_graph:
        return install_graphs(patcher, own_replace_patch=attention_replace, step_cache=step_cache)
    return install_step_cache(patcher, step_cache) if step_cache is not None else None


def _patch_attention(patcher, diffusion_model, attention: bool, override_supported: bool | None) -> None:
    if not attention:
        return
    if override_supported is None:
        override_supported = _override_supported()
    if override_supported:
        patcher.model_options["transformer_options"]["optimized_attention_override"] = attention_override
    else:  # an older ComfyUI, or Forge: replace the attention of every transformer block
        for block_name, number, index in _transformer_block_keys(diffusion_model):
            patcher.set_model_attn1_replace(attention_replace, block_name, number, index)
            patcher.set_model_attn2_replace(attention_replace, block_name, number, index)
