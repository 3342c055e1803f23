"""Patches for models driven by ComfyUI's ModelPatcher: ComfyUI itself and Forge (which vendors it).

What the ComfyUI node and the A1111 extension's Forge path share (docs/design.md, convention 10: one copy of
the patch logic): which modules of ComfyUI's UNet and VAE are which, kernel-backed copies of its norm
modules to install as object patches, and attention in ComfyUI's calling conventions, either as the
per-model `optimized_attention_override` or as attn1/attn2 replace patches.
"""
from __future__ import annotations

import functools

from torch import nn

from ..checkpoints import architecture_for
from ..modules.attention import heads_first, heads_last, spatial_attention
from ..ops.attention import host_call_uses_op, scaled_dot_product_attention
from ..ops.attention_fp8 import fp8_call_uses_op, scaled_dot_product_attention_fp8
from .comfy_graph import install_graphs, install_step_cache
from ..modules import comfy_dit_cache
from ..modules.comfy_dit_cache import ComfyDiTStepCache
from ..modules.step_cache import ComfyStepCache, comfy_unet_problem
from ..modules.vae_tiles import HostTiledDecode
from .step_cache import other_kind
from . import attention_fp8 as attention_fp8_patch
from . import comfy_dit
from . import comfy_dit_precision
from . import ldm_swaps
from . import precision as precision_patch


def _host_casts(module) -> bool:
    """ComfyUI casts or streams this module's weights per call (low-VRAM, fp8, manual cast), or Forge does (its
    operations' parameters_manual_cast, which its memory management also sets on the modules it offloads; a scaled
    fp8 weight; online LoRA): its own path."""
    return bool(getattr(module, "comfy_cast_weights", False) or getattr(module, "weight_function", None)
                or getattr(module, "bias_function", None) or getattr(module, "parameters_manual_cast", False)
                or getattr(module, "scale_weight", None) is not None or getattr(module, "forge_online_loras", None))


# ---- which modules are which: patch/ldm_swaps.py, with ComfyUI's own path for weights it casts per call -------

def model_paths(patcher, prefix: str = "") -> ldm_swaps.Resolve:
    """ldm_swaps' `resolve` for the ModelPatcher `patcher` (`prefix`: its object patches' path of the root walked,
    "diffusion_model." for a UNet): the module the MODEL's own object patches put at a path; else the model's own
    module, which ComfyUI keeps in object_patches_backup (shared by all clones) while the object patch of another,
    loaded clone holds the path; else the module there. The node runs when ComfyUI says, often while another clone
    of the model is loaded (a LoRA'd MODEL, the previous run's optimized one): what the model shows then is that
    clone's."""
    patches = getattr(patcher, "object_patches", {})
    backups = getattr(patcher, "object_patches_backup", {})

    def resolve(path: str, module):
        key = prefix + path if path else prefix.rstrip(".")
        return patches[key] if key in patches else backups.get(key, module)
    return resolve


def norm_swaps(root, group_norm: bool = True, layer_norm: bool = True,
               resolve: ldm_swaps.Resolve | None = None) -> dict[str, object]:
    """ldm_swaps.norm_swaps for a ComfyUI UNet or VAE."""
    return ldm_swaps.norm_swaps(root, group_norm, layer_norm, host_path=_host_casts, resolve=resolve)


def upsample_swaps(root, resolve: ldm_swaps.Resolve | None = None) -> dict[str, object]:
    """ldm_swaps.upsample_swaps for a ComfyUI VAE."""
    return ldm_swaps.upsample_swaps(root, host_path=_host_casts, resolve=resolve)


def conv_swaps(root, skip: dict | None = None, resolve: ldm_swaps.Resolve | None = None) -> dict[str, object]:
    """ldm_swaps.conv_swaps for a ComfyUI UNet or VAE."""
    return ldm_swaps.conv_swaps(root, skip, host_path=_host_casts, resolve=resolve)


def vae_tile_swaps(root) -> dict[str, object]:
    """The object patch that decodes a ComfyUI VAE in fixed-shape tiles (modules/vae_tiles.py): its first-stage
    model's decode(z, **options), which ComfyUI's VAE.decode calls per batch of latents."""
    if not callable(getattr(type(root), "decode", None)) or not isinstance(getattr(root, "decoder", None), nn.Module):
        return {}
    return {"decode": HostTiledDecode(root)}


def model_architecture(patcher) -> str:
    """rocm_sd.models' architecture (sd15, sd21, sdxl) of a ComfyUI MODEL, from the UNet config ComfyUI detected
    for it (comfy/supported_models.py); ValueError for other models."""
    config = getattr(getattr(patcher.model, "model_config", None), "unet_config", None)
    if not config:
        raise ValueError("this MODEL carries no UNet config (not one of ComfyUI's Stable Diffusion models)")
    return architecture_for(config.get("context_dim"), config.get("adm_in_channels") or None)


# ---- attention ---------------------------------------------------------------------------------------------

def comfy_attention(q, k, v, heads, skip_reshape=False, skip_output_reshape=False, fp8_format=None):
    """ComfyUI's attention contract, unmasked (masked calls stay ComfyUI's own): (B, L, heads*D) unless
    skip_reshape (then (B, H, L, D)); output (B, L, heads*D) unless skip_output_reshape. With fp8_format, through
    rocm_sd::attention_fp8 (the FP8 kernel where the tuning database measured it faster)."""
    if not skip_reshape:
        q, k, v = (heads_first(t, heads) for t in (q, k, v))
    out = (scaled_dot_product_attention(q, k, v) if fp8_format is None
           else scaled_dot_product_attention_fp8(q, k, v, fp8_format))
    return out if skip_output_reshape else heads_last(out)


def attention_override(original, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
                       skip_output_reshape=False, fp8_format=None, **kwargs):
    """transformer_options["optimized_attention_override"]: rocm_sd's attention op where ops/attention.py's
    host_call_uses_op says so (a tuned choice may apply: its kernel, a CK instance or one SDPA backend), else
    ComfyUI's own function, which also runs masked calls and arguments this one does not know (a newer ComfyUI's
    GQA...). Where rocm_sd would run PyTorch's SDPA anyway, ComfyUI's own function is the better SDPA call: ComfyUI
    picks SDPA's backend order (cuDNN first on NVIDIA, faster at SD's shapes: bench/results/comfyui-h200.md) and
    costs no extra host time. With fp8_format (the node's attention_precision fp8), unmasked calls go to
    rocm_sd::attention_fp8 where ops/attention_fp8.py's fp8_call_uses_op says so, and as above elsewhere."""
    unknown = set(kwargs) - {"transformer_options", "_inside_attn_wrapper"}
    if not unknown and fp8_format is not None and mask is None and fp8_call_uses_op(q):
        return comfy_attention(q, k, v, heads, skip_reshape, skip_output_reshape, fp8_format)
    if unknown or not host_call_uses_op(q, q.shape[-1] if skip_reshape else q.shape[-1] // heads, mask):
        return original(q, k, v, heads, mask=mask, attn_precision=attn_precision, skip_reshape=skip_reshape,
                        skip_output_reshape=skip_output_reshape, **kwargs)
    return comfy_attention(q, k, v, heads, skip_reshape, skip_output_reshape)


def attention_replace(q, k, v, extra_options, fp8_format=None):
    """An attn1/attn2 replace patch (ComfyUI without the override): q, k, v are (B, L, heads*D), no mask."""
    return comfy_attention(q, k, v, extra_options["n_heads"], fp8_format=fp8_format)


def forge_flux_attention(original, q, k, v, heads, fp8_format=None):
    """The attention of Forge's Flux blocks (modules/comfy_dit.py's copies call it where Forge's attention() would
    call `original`, its attention_function(q, k, v, heads, skip_reshape=True)): q, k, v (B, H, L, D), out
    (B, L, heads * D). rocm_sd's attention op where host_call_uses_op says so (with fp8_format, rocm_sd::attention_fp8
    where fp8_call_uses_op says so), else Forge's own function, as attention_override decides for ComfyUI."""
    if fp8_format is not None and fp8_call_uses_op(q):
        return comfy_attention(q, k, v, heads, skip_reshape=True, fp8_format=fp8_format)
    if not host_call_uses_op(q, q.shape[-1], None):
        return original(q, k, v, heads, skip_reshape=True)
    return comfy_attention(q, k, v, heads, skip_reshape=True)


def attention_patches(fp8_format: str | None = None) -> tuple:
    """(the override, the replace patch) ComfyUI calls: fp16, or with FP8 attention in `fp8_format`."""
    if fp8_format is None:
        return attention_override, attention_replace
    return (functools.partial(attention_override, fp8_format=fp8_format),
            functools.partial(attention_replace, fp8_format=fp8_format))


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
                        cache_threshold: float = 0.15, precision: str = "fp16", cache_branch: int = 0,
                        precision_layers: str = "measured", attention_precision: str = "fp16",
                        dit_cache_threshold: float | None = None) -> list[str]:
    """Install rocm_sd on `patcher` (a clone: the caller never passes the user's own model) as object
    patches and attention patches, with channels_last the convolutions on channels_last weights (NHWC
    activations), with cuda_graph the model evaluation as a replayed graph (patch/comfy_graph.py), with cache
    ('deepcache' / 'adaptive', cache_interval, cache_threshold, cache_branch: as optimize()'s options;
    docs/step_cache.md) step caching of the UNet, with cache 'fbcache' / 'teacache' (dit_cache_threshold: None for
    the model's published default) that of SD3 / SD3.5 and Flux (modules/comfy_dit_cache.py), and with
    precision 'fp8' / 'int8' (as optimize()'s, with precision_layers; docs/precision.md) its linear layers as 8-bit
    GEMMs, with attention_precision 'fp8' its attention through rocm_sd::attention_fp8 (as optimize()'s).
    SD3 / SD3.5 and Flux models (patch/comfy_dit.py; Forge's Flux too) get their blocks' fused forwards with
    layer_norm, attention as UNets do (Forge's Flux blocks: through their copies, forge_flux_attention), graph capture,
    the transformers' step cache and precision on their blocks' linear layers (patch/comfy_dit_precision.py: the
    layers diffusers' transformers quantize); channels_last does not apply to them.
    override_supported: None to detect ComfyUI's `wrap_attn`. Returns what could not be installed, and why (and
    which blocks stay ComfyUI's, and who runs what where comfy-kitchen is loaded too)."""
    get = getattr(patcher, "get_model_object", None)  # older ComfyUI and Forge's vendored copy lack it
    diffusion_model = get("diffusion_model") if get is not None else patcher.model.diffusion_model
    not_installed = []
    resolve = model_paths(patcher, "diffusion_model.")
    dit = comfy_dit.is_dit(diffusion_model)
    fp8_format = None
    if attention_precision == "fp8":
        fp8_format, why = fp8_attention_format(patcher.load_device, attention)
        if why:
            not_installed.append(f"attention_precision=fp8 not applied: {why}")
    if dit:  # SD3 / SD3.5, Flux: their blocks' AdaLN chains (the layer_norm option), no convolutions to speak of
        forge_attention = functools.partial(forge_flux_attention, fp8_format=fp8_format) if attention else None
        swaps, notes = (comfy_dit.dit_swaps(diffusion_model, _host_casts, resolve, forge_attention) if layer_norm
                        else ({}, []))
        not_installed += notes
    else:
        swaps = norm_swaps(diffusion_model, group_norm, layer_norm, resolve)
    if channels_last and not dit:
        swaps.update(conv_swaps(diffusion_model, resolve=resolve))
    if precision != "fp16":
        fmt, why = precision_patch.number_format(patcher.load_device, precision)
        if why:
            not_installed.append(f"precision={precision} not applied: {why}")
        elif dit:  # SD3 / SD3.5, Flux: the blocks' linear layers that diffusers' transformers quantize
            quantized, notes = comfy_dit_precision.quantized_dit_swaps(
                diffusion_model, precision, fmt, precision_patch.MULTIPLE[precision], _host_patches_per_call,
                resolve, measured=precision_layers == "measured")
            swaps.update(quantized)
            not_installed += notes
        else:
            swaps.update(quantized_swaps(diffusion_model, fmt, precision_patch.MULTIPLE[precision], swaps,
                                         measured=precision_layers == "measured", resolve=resolve))
    for path, module in swaps.items():
        patcher.add_object_patch(f"diffusion_model.{path}", module)
    override, replace = attention_patches(fp8_format)
    _patch_attention(patcher, diffusion_model, attention, override_supported, override, replace)
    step_cache, problem = _step_cache(diffusion_model, dit, cache, cache_interval, cache_threshold, cache_branch,
                                      dit_cache_threshold)
    if problem:
        not_installed.append(f"step cache not applied: {problem}")
        cache = None
    if cuda_graph:
        why = install_graphs(patcher, own_replace_patch=replace, step_cache=step_cache)
    else:
        why = install_step_cache(patcher, step_cache) if step_cache is not None else None
    if why:
        wanted = [name for name, on in (("graph capture", cuda_graph), ("step cache", cache)) if on]
        not_installed.append(f"no {' and no '.join(wanted)}: {why}")
    return not_installed


def _step_cache(diffusion_model, dit: bool, mode: str | None, interval: int, threshold: float, branch: int,
                dit_threshold: float | None) -> tuple[ComfyStepCache | ComfyDiTStepCache | None, str | None]:
    """(the step cache of `mode` for the model, None) or (None, why it cannot have one: a mode of the other kind of
    model, or a structure the mode cannot serve)."""
    if not mode:
        return None, None
    problem = other_kind(mode, dit) or (comfy_dit_cache.cache_problem(diffusion_model, mode) if dit
                                        else comfy_unet_problem(diffusion_model, branch))
    if problem:
        return None, problem
    if not dit:
        return ComfyStepCache(mode, interval, threshold, branch=branch), None
    published = dit_threshold is None
    limit = comfy_dit_cache.default_threshold(mode, diffusion_model) if published else dit_threshold
    return ComfyDiTStepCache(mode, limit, published=published), None


def quantized_swaps(diffusion_model, format: str, multiple: int, norms: dict[str, object],
                    measured: bool = True, resolve: ldm_swaps.Resolve | None = None) -> dict[str, object]:
    """ldm_swaps.quantized_linear_swaps for a ComfyUI UNet. The transformer blocks' LayerNorm copies among `norms`
    (norm_swaps' output: none when layer_norm is off) whose every consumer is quantized write their output quantized
    too. A layer whose weights ComfyUI streams or patches per call (low-VRAM mode) runs ComfyUI's own forward; one
    whose weights ComfyUI stores in fp8 itself (weight_dtype fp8_e4m3fn) is quantized from them. With `measured`
    (precision_layers="measured") each layer goes back to ComfyUI's own forward at its first call where the tuning
    database measured fp16 faster (QuantizedHostCopy.rocm_sd_offer_fp16)."""
    swaps = ldm_swaps.quantized_linear_swaps(diffusion_model, format, multiple, host_path=_host_patches_per_call,
                                             resolve=resolve)
    sharers, producers = dict.fromkeys(swaps, 1), {path: [] for path in swaps}
    for norm, paths, all_quantized in ldm_swaps.quantized_input_groups(diffusion_model, swaps, resolve):
        writes = all_quantized and hasattr(norms.get(norm), "rocm_sd_quantized_output")
        if writes:
            norms[norm].rocm_sd_quantized_output = format
        for path in paths:
            sharers[path] = len(paths)
            producers[path] += [norms[norm]] if writes else []
    if measured:
        for path, layer in swaps.items():
            layer.rocm_sd_offer_fp16(sharers[path], producers[path])
    return swaps


def _host_patches_per_call(module) -> bool:
    """ComfyUI computes this module's weight per call (LoRA patches in low-VRAM mode; an older ComfyUI's scaled fp8
    weight, which its forward multiplies by scale_weight): its own path. A weight it merely casts (fp8 storage,
    manual cast) is quantized from as it is: the cast is exact."""
    return bool(getattr(module, "weight_function", None) or getattr(module, "bias_function", None)
                or getattr(module, "scale_weight", None) is not None)


def fp8_attention_format(device, attention: bool) -> tuple[str | None, str | None]:
    """(the FP8 format of `device`, None), or (None, why FP8 attention cannot run: no FP8 matrix units, or the
    node's attention option is off)."""
    fmt, why = attention_fp8_patch.fp8_of(device)
    if fmt is not None and not attention:
        return None, "the attention option is off"
    return fmt, why


def _patch_attention(patcher, diffusion_model, attention: bool, override_supported: bool | None, override,
                     replace) -> None:
    if not attention:
        return
    if override_supported is None:
        override_supported = _override_supported()
    if override_supported:
        patcher.model_options["transformer_options"]["optimized_attention_override"] = override
    else:  # an older ComfyUI, or Forge: replace the attention of every transformer block
        for block_name, number, index in _transformer_block_keys(diffusion_model):
            patcher.set_model_attn1_replace(replace, block_name, number, index)
            patcher.set_model_attn2_replace(replace, block_name, number, index)
