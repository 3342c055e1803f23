"""rocm_sd for AUTOMATIC1111: a cross-attention optimization named "rocm_sd" (Settings > Optimizations, or
--rocm-sd with "Automatic"), registered through script_callbacks.on_list_optimizers.

apply() points ldm's and sgm's CrossAttention.forward (SD1.x/2.x and SDXL) and the VAE's AttnBlock.forward at
rocm_sd's attention, computing what the webui's own SDP optimization computes: hypernetworks still act on
the keys' and values' context, and the "upcast cross attention layer to float32" setting is honoured.
undo() is SdOptimization's own, which restores the webui's forwards. On Forge, which never applies
SdOptimizations, RocmSdForge patches a clone of the UNet patcher before each sampling instead. A thin shim: the attention itself
is rocm_sd.ops.attention's scaled_dot_product_attention (rocm_sd's kernel where tuned faster, else PyTorch SDPA). Without rocm_sd nothing is registered,
and one log line says why.
"""
import logging

import torch

from modules import script_callbacks, scripts, sd_hijack_optimizations, shared
from modules.hypernetworks import hypernetwork

log = logging.getLogger("rocm_sd.a1111")

try:
    from rocm_sd.modules.attention import heads_first, heads_last, spatial_attention
    from rocm_sd.ops.attention import scaled_dot_product_attention as rocm_attention
    from rocm_sd.patch.comfy import patch_model_patcher
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


class SdOptimizationRocmSd(sd_hijack_optimizations.SdOptimization):
    name = "rocm_sd"
    label = "rocm_sd kernels (AMD GPUs)"
    cmd_opt = "rocm_sd"
    priority = 110  # above the webui's own (xformers 100, sdp 80) when it is available

    def is_available(self):
        return UNAVAILABLE is None and torch.cuda.is_available()

    def apply(self):
        for cross_attention, attn_block in _attention_modules():
            cross_attention.forward = cross_attention_forward
            attn_block.forward = attnblock_forward


def list_optimizers(res):
    if UNAVAILABLE is None:
        res.append(SdOptimizationRocmSd())


script_callbacks.on_list_optimizers(list_optimizers)


class RocmSdForge(scripts.Script):
    """Forge never applies SdOptimizations; with --rocm-sd, each sampling gets a clone of Forge's UNet
    patcher with rocm_sd installed the way the ComfyUI node installs it (rocm_sd.patch.comfy: norm kernels
    as object patches, attention as attn1/attn2 replace patches). Plain AUTOMATIC1111 never calls this hook."""

    def title(self):
        return "rocm_sd"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def process_before_every_sampling(self, p, *args, **kwargs):
        forge_objects = getattr(p.sd_model, "forge_objects", None)
        if forge_objects is None or UNAVAILABLE or not getattr(shared.cmd_opts, "rocm_sd", False):
            return
        unet = forge_objects.unet.clone()
        patch_model_patcher(unet, override_supported=False)
        forge_objects.unet = unet
