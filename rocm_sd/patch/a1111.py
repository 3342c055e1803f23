"""rocm_sd on the AUTOMATIC1111 webui's models (SD1.x/2.x through CompVis ldm, SDXL through Stability's sgm).

The webui has no object patches: the extension changes its model in place, every change recorded in a PatchRecord
(patch/core.py) and undone when the webui unloads the model or switches away from the "rocm_sd" optimization.
Which modules are swapped is patch/ldm_swaps.py's (the ComfyUI node's logic: ComfyUI's UNet is the same
lineage); graphs are patch/a1111_graph.py's. The attention forwards are the extension's own, set on the webui's
classes as every SdOptimization sets them.
"""
from __future__ import annotations

from collections import Counter

from torch import nn

from . import ldm_swaps
from .a1111_graph import GraphedUNetForward, sgm_timestep_embedding, sgm_timestep_embedding_site, webui_module
from .core import PatchRecord

FEATURES = ("group_norm", "layer_norm", "fold_upsample", "channels_last", "cuda_graph")


def webui_host_path(module: nn.Module) -> bool:
    """host_path (patch/ldm_swaps.py) for the webui: what the webui's own patched forwards of Linear / Conv2d /
    GroupNorm / LayerNorm do before computing, done here for the kernel-backed copies.

    - LoRA (extensions-builtin/Lora): its networks are merged into the weights in place, lazily, by each module's
      forward (network_apply_weights): done here first; with "Lora: use the old method" (lora_functional) the
      networks are computed in the forward instead, so the module's own forward runs.
    - devices.manual_cast (weights stored in a dtype the GPU cannot compute in, e.g. fp8 storage): the webui's
      casting forward runs.
    - circular tiling: sd_hijack sets padding_mode on the webui's original convolutions only; the copy follows.
    """
    devices = webui_module("modules.devices")
    if devices is not None and any(hasattr(cls, "org_forward") for cls in getattr(devices, "patch_module_list", ())):
        return True
    networks = webui_module("networks")
    if networks is not None and hasattr(networks, "network_apply_weights"):
        opts = getattr(webui_module("modules.shared"), "opts", None)
        if getattr(opts, "lora_functional", False) and getattr(networks, "loaded_networks", None):
            return True
        networks.network_apply_weights(module)
    if isinstance(module, nn.Conv2d):
        hijack = getattr(webui_module("modules.sd_hijack"), "model_hijack", None)
        module.padding_mode = "circular" if getattr(hijack, "circular_enabled", False) else "zeros"
    return False


def _install(record: PatchRecord, root: nn.Module, swaps: dict[str, nn.Module], count: str) -> None:
    for path, new in swaps.items():
        parent_path, _, name = path.rpartition(".")
        parent = root.get_submodule(parent_path) if parent_path else root
        # The copies share the original's attribute dictionary (modules/host_copies.py): what the webui sets on them
        # while they run (LoRA's network_current_names and weight backups) is the original's when it comes back.
        record.replace_child(parent, name, new)
        record.counts[count] += 1


def patch_sd_model(sd_model, group_norm: bool = True, layer_norm: bool = True, fold_upsample: bool = True,
                   channels_last: bool = True, cuda_graph: bool = True,
                   host_path=webui_host_path) -> PatchRecord:
    """rocm_sd's module swaps on a loaded webui model (its UNet `model.diffusion_model` and its VAE
    `first_stage_model`), and with cuda_graph the UNet's evaluations replayed per input shape. Returns the record;
    `record.revert()` restores the model exactly (the webui's own modules and forward)."""
    record = PatchRecord(flags={"group_norm": group_norm, "layer_norm": layer_norm, "fold_upsample": fold_upsample,
                                "channels_last": channels_last, "cuda_graph": cuda_graph})
    unet = sd_model.model.diffusion_model
    swaps = ldm_swaps.norm_swaps(unet, group_norm, layer_norm, host_path)
    if channels_last:
        swaps.update(ldm_swaps.conv_swaps(unet, host_path=host_path))
    _install(record, unet, swaps, "UNet modules")
    vae = getattr(sd_model, "first_stage_model", None)
    if vae is not None:
        swaps = ldm_swaps.norm_swaps(vae, group_norm, layer_norm=False, host_path=host_path)
        upsamplers = ldm_swaps.upsample_swaps(vae, host_path) if fold_upsample else {}
        swaps.update(upsamplers)
        if channels_last:
            swaps.update(ldm_swaps.conv_swaps(vae, skip=upsamplers, host_path=host_path))
        _install(record, vae, swaps, "VAE modules")
    if cuda_graph:
        graphed = GraphedUNetForward(unet)
        record.set_attr(unet, "forward", graphed)
        record.on_revert(graphed.clear)
        record.graphed["unet"] = graphed
        site = sgm_timestep_embedding_site()
        if site is not None:
            record.set_attr(*site, sgm_timestep_embedding)
    return record


def graph_stats(record: PatchRecord | None):
    """The UNet graphs' statistics of a record patch_sd_model made (empty without graphs)."""
    graphed = record.graphed.get("unet") if record is not None else None
    return Counter(graphed.stats) if graphed is not None else Counter()


__all__ = ["FEATURES", "patch_sd_model", "graph_stats", "webui_host_path"]
