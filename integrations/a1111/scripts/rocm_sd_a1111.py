"""rocm_sd for AUTOMATIC1111: a cross-attention optimization named "rocm_sd" (Settings > Optimizations, or
--rocm-sd with "Automatic"), registered through script_callbacks.on_list_optimizers, and a Settings section
"rocm_sd" with one checkbox per feature (and, for Forge's Flux, the ComfyUI node's step cache options).

While "rocm_sd" is the webui's optimization, the loaded model (applied when it is loaded, or when the optimization
or a checkbox changes; removed when the webui switches optimization or loads another model) runs:
- attention: ldm's and sgm's CrossAttention.forward (SD1.x/2.x and SDXL) and the VAE's AttnBlock.forward through
  rocm_sd's attention, computing what the webui's own SDP optimization computes (hypernetworks still act on the
  keys' and values' context, "upcast cross attention layer to float32" is honoured); off: the webui's sdp;
- the UNet's and VAE's GroupNorm(+SiLU) and LayerNorm as rocm_sd's kernels, the VAE's upsamplers folded,
  convolutions on channels_last views, the UNet's evaluations replayed as captured graphs per input shape
  (rocm_sd.patch.a1111: the ComfyUI node's logic, patch/ldm_swaps.py, on the webui's model in place).
On Forge, which never applies SdOptimizations, RocmSdForge patches a clone of the UNet patcher before each sampling
instead (rocm_sd.patch.comfy, as the ComfyUI node), its Flux with the step cache setting (fbcache / teacache, off by
default). A thin shim: without rocm_sd nothing is registered, and one log
line says why.
"""
import logging
import math

import torch

from modules import script_callbacks, scripts, sd_hijack_optimizations, shared
from modules.hypernetworks import hypernetwork

log = logging.getLogger("rocm_sd.a1111")

try:
    from rocm_sd.modules.attention import heads_first, heads_last, spatial_attention
    from rocm_sd.ops.attention import scaled_dot_product_attention as rocm_attention
    from rocm_sd.patch.a1111 import graph_stats, patch_sd_model
    from rocm_sd.patch.a1111_graph import hooked_by_another
    from rocm_sd.patch.comfy import patch_model_patcher
    from rocm_sd.patch.comfy_graph import installed_step_cache, step_cache_notice
    UNAVAILABLE = None
except ImportError as exc:
    UNAVAILABLE = f"rocm_sd is not importable ({exc}); the 'rocm_sd' optimization is not offered"
    log.warning("rocm_sd: %s", UNAVAILABLE)


def cross_attention_forward(self, x, context=None, mask=None, **kwargs):
    """ldm/sgm CrossAttention.forward through rocm_sd's attention, as the webui's SDP forward computes it."""
    batch = x.shape[0]
    q_in = self.to_q(x)
    context = x if context is None else context
    context_k, context_v = hypernetwork.apply_hypernetworks(shared.loaded_hypernetworks, context)
    k_in, v_in = self.to_k(context_k), self.to_v(context_v)
    q, k, v = (heads_first(t, self.heads) for t in (q_in, k_in, v_in))
    if mask is not None:
        mask = mask.view(batch, 1, -1, mask.shape[-1]) if mask.dim() == 3 else mask
    dtype = q.dtype
    if shared.opts.upcast_attn:
        q, k, v = q.float(), k.float(), v.float()
    out = heads_last(rocm_attention(q, k, v, mask)).to(dtype)
    return self.to_out[1](self.to_out[0](out))


def attnblock_forward(self, x):
    """The VAE's AttnBlock.forward (one head of C channels over H*W positions) through rocm_sd's attention."""
    h_ = self.norm(x)
    q, k, v = self.q(h_), self.k(h_), self.v(h_)
    dtype = q.dtype
    if shared.opts.upcast_attn:
        q, k, v = q.float(), k.float(), v.float()
    return x + self.proj_out(spatial_attention(q, k, v).to(dtype))


def _attention_modules():
    """(CrossAttention class, AttnBlock class) of ldm and, where installed, sgm (SDXL)."""
    import ldm.modules.attention
    import ldm.modules.diffusionmodules.model

    found = [(ldm.modules.attention.CrossAttention, ldm.modules.diffusionmodules.model.AttnBlock)]
    try:
        import sgm.modules.attention
        import sgm.modules.diffusionmodules.model

        found.append((sgm.modules.attention.CrossAttention, sgm.modules.diffusionmodules.model.AttnBlock))
    except ImportError:
        pass
    return found


# ---- settings: one checkbox per feature, as the ComfyUI node's options -------------------------------------

SECTION = ("rocm_sd", "rocm_sd")
OPTIONS = {  # feature -> label; every one on by default
    "attention": "Attention through rocm_sd (off: the webui's sdp)",
    "group_norm": "GroupNorm (+ the SiLU after it) as one kernel, in the UNet and the VAE",
    "layer_norm": "The transformer blocks' LayerNorms as rocm_sd's kernel",
    "fold_upsample": "VAE: each upsampler's nearest 2x + 3x3 convolution folded into one convolution",
    "channels_last": "Convolutions on channels_last views of their weights (NHWC activations, no layout transposes)",
    "cuda_graph": ("Replay each UNet evaluation as one captured GPU graph per input shape (VRAM for its "
                   "activations; steps with ControlNet, --medvram/--lowvram or token merging run as usual)"),
}


def setting(feature: str) -> bool:
    return bool(getattr(shared.opts, f"rocm_sd_{feature}", True))


# The transformers' step cache: the ComfyUI node's `cache` (its fbcache / teacache modes) and `dit_cache_threshold`
# options, by the same names and defaults (off; -1: the published threshold for the model). Forge's Flux only: read
# before each sampling, which gets a cache of its own (rocm_sd/modules/comfy_dit_cache.py; docs/a1111.md).
CACHE_MODES = ("off", "fbcache", "teacache")
CACHE_LABEL = ("Forge's Flux: step cache (changes images). 'fbcache' (First Block Cache) skips the blocks after the "
               "first where the first block's residual changed less than the threshold, 'teacache' all blocks where "
               "the first block's modulated input did, adding the skipped blocks' kept residual")
THRESHOLD_LABEL = ("Forge's Flux: step cache threshold; higher skips more. -1: the published default (fbcache 0.08, "
                   "teacache 0.4); 0: every evaluation in full")


def cache_setting() -> tuple:
    """(mode, threshold) for patch_model_patcher's cache / dit_cache_threshold: (None, None) while off; threshold None
    for the published default. A value the settings should not hold is said once and read as off / the default."""
    mode = getattr(shared.opts, "rocm_sd_cache", "off")
    if mode not in CACHE_MODES:
        _say_once(f"step cache setting {mode!r} is not one of {', '.join(CACHE_MODES)}: the step cache is off")
        return None, None
    if mode == "off":
        return None, None
    value = getattr(shared.opts, "rocm_sd_dit_cache_threshold", -1.0)
    try:
        threshold = float(value)
    except (TypeError, ValueError):
        threshold = math.nan
    if math.isnan(threshold):
        _say_once(f"step cache threshold {value!r} is not a number: the published default applies")
        return mode, None
    return mode, None if threshold < 0 else threshold


def on_ui_settings():
    import gradio as gr  # the webui's own; imported where the settings are made, as its options are

    for feature, label in OPTIONS.items():
        shared.opts.add_option(f"rocm_sd_{feature}", shared.OptionInfo(
            True, label, section=SECTION, onchange=_settings_changed).info("applies when 'rocm_sd' is the "
                                                                           "cross attention optimization"))
    shared.opts.add_option("rocm_sd_cache", shared.OptionInfo(
        "off", CACHE_LABEL, gr.Radio, {"choices": list(CACHE_MODES)}, section=SECTION).info(
        "Forge with --rocm-sd; applies from the next generation"))
    shared.opts.add_option("rocm_sd_dit_cache_threshold", shared.OptionInfo(
        -1.0, THRESHOLD_LABEL, gr.Number, section=SECTION).info("Forge with --rocm-sd"))


# ---- the loaded model's patches: on while "rocm_sd" is the webui's optimization -----------------------------

class _Patched:
    active = False   # "rocm_sd" is the applied optimization
    record = None    # rocm_sd.patch.core.PatchRecord of the patched model
    model = None
    said: set = set()


def _say_once(message: str) -> None:
    if message not in _Patched.said:
        _Patched.said.add(message)
        print(f"rocm_sd: {message}")


def _loaded_model():
    from modules import sd_models

    return getattr(sd_models.model_data, "sd_model", None)


def unpatch() -> None:
    if _Patched.record is not None:
        _Patched.record.revert()
    _Patched.record = _Patched.model = None


def repatch(sd_model=None) -> None:
    """Remove rocm_sd's module patches from the model they are on, and, while "rocm_sd" is the webui's
    optimization, install them on `sd_model` (default: the loaded model) with the current settings."""
    unpatch()
    sd_model = sd_model if sd_model is not None else _loaded_model()
    if not _Patched.active or sd_model is None or not hasattr(getattr(sd_model, "model", None), "diffusion_model"):
        return
    features = {feature: setting(feature) for feature in OPTIONS if feature != "attention"}
    if cache_setting()[0] is not None:
        _say_once("the step cache setting applies to Forge's Flux; AUTOMATIC1111's models run without it")
    _Patched.record, _Patched.model = patch_sd_model(sd_model, **features), sd_model
    on = [feature for feature, enabled in features.items() if enabled] + ["attention"] * setting("attention")
    print(f"rocm_sd: {', '.join(on) or 'nothing'} on {type(sd_model).__name__} "
          f"({dict(_Patched.record.counts)})")


def _settings_changed() -> None:
    if _Patched.active:
        _set_attention()
        repatch()


def _set_attention() -> None:
    if not setting("attention"):
        sd_hijack_optimizations.SdOptimizationSdp().apply()
        return
    for cross_attention, attn_block in _attention_modules():
        cross_attention.forward = cross_attention_forward
        attn_block.forward = attnblock_forward


class SdOptimizationRocmSd(sd_hijack_optimizations.SdOptimization):
    name = "rocm_sd"
    label = "rocm_sd kernels (AMD GPUs)"
    cmd_opt = "rocm_sd"
    priority = 110  # above the webui's own (xformers 100, sdp 80) when it is available

    def is_available(self):
        return UNAVAILABLE is None and torch.cuda.is_available()

    def apply(self):
        # The webui calls this when it hijacks a model it loads (the new model is not yet the loaded one then:
        # on_model_loaded patches it) and when the optimization is selected (the loaded model is patched here).
        _set_attention()
        _Patched.active = True
        repatch()

    def undo(self):
        super().undo()
        _Patched.active = False
        unpatch()


def list_optimizers(res):
    if UNAVAILABLE is None:
        res.append(SdOptimizationRocmSd())


def on_model_loaded(sd_model):
    if _Patched.active:
        repatch(sd_model)


if UNAVAILABLE is None:
    script_callbacks.on_list_optimizers(list_optimizers)
    script_callbacks.on_ui_settings(on_ui_settings)
    script_callbacks.on_model_loaded(on_model_loaded)


class RocmSdScript(scripts.Script):
    """AUTOMATIC1111: says once when the UNet's graphs step aside for a generation (sd-webui-controlnet replaces
    the UNet's forward while it runs). Forge (which never applies SdOptimizations): with --rocm-sd, each sampling
    gets a clone of Forge's UNet patcher with rocm_sd installed the way the ComfyUI node installs it
    (rocm_sd.patch.comfy: norm kernels as object patches, attention as attn1/attn2 replace patches, and the
    channels_last and graph checkboxes; Forge's own Flux gets the node's fused Flux blocks as object patches, their
    attention through rocm_sd with the attention checkbox, and the step cache setting). Each sampling (hires fix's
    second pass too) gets a new clone, and so a step cache of its own: no residual crosses from one to the next."""

    def title(self):
        return "rocm_sd"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def process_before_every_sampling(self, p, *args, **kwargs):
        if UNAVAILABLE:
            return
        forge_objects = getattr(p.sd_model, "forge_objects", None)
        if forge_objects is None:
            record = _Patched.record
            if record is not None and "unet" in record.graphed and hooked_by_another(p.sd_model.model.diffusion_model):
                _say_once("UNet evaluations without graph replay while another extension (sd-webui-controlnet) "
                          "replaces the UNet's forward")
            return
        if not getattr(shared.cmd_opts, "rocm_sd", False):
            return
        cache, threshold = cache_setting()
        unet = forge_objects.unet.clone()
        not_installed = patch_model_patcher(unet, override_supported=False, cuda_graph=setting("cuda_graph"),
                                            channels_last=setting("channels_last"), group_norm=setting("group_norm"),
                                            layer_norm=setting("layer_norm"), attention=setting("attention"),
                                            cache=cache, dit_cache_threshold=threshold)
        step_cache = installed_step_cache(unet)
        for why in not_installed + ([step_cache_notice(step_cache)] if step_cache is not None else []):
            _say_once(f"on Forge, {why}")
        forge_objects.unet = unet


def unet_graph_stats():
    """The loaded model's UNet graph statistics (captures, replays, eager calls and why): for checks and benches."""
    return graph_stats(_Patched.record)
