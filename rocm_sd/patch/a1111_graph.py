"""Graph capture of the AUTOMATIC1111 webui's UNet evaluations, per input signature.

Why: as in ComfyUI (patch/comfy_graph.py), an eager SD step is bound by host time on a fast GPU; replayed as one
graph it costs its kernels' time.

How: a GraphedUNetForward is set as the UNet's own `forward` (an instance attribute, which nn.Module's call finds
before the class's). The webui's samplers reach it through CFGDenoiser -> apply_model -> DiffusionWrapper ->
UNetModel(x, timesteps, context, y=...). It hands the call to a GraphedCall (rocm_sd/graphs.py: one graph per
signature of shapes, dtypes and weight storage) of the class's forward, looked up per call so that the webui's own
patch of UNetModel.forward (sd_unet's SdUnet dispatch) keeps working. A graph replays the Python decisions of its
capture, so a call runs eagerly, its reason logged once and counted in `stats`, whenever the webui may decide
differently from call to call (`webui_blocker`):
- keyword arguments other than timesteps / context / y (an extension passing its own, e.g. control residuals);
- an SdUnet option (TensorRT...) replacing the UNet, --medvram / --lowvram (modules move between CPU and GPU
  per call), token merging (ToMe's merge indices are Python-side decisions);
- whatever GraphedCall refuses (CPU tensors, autograd on, a capture failure...).
sd-webui-controlnet replaces the UNet's forward with its own while it is active: this object is then not called at
all, and `hooked_by_another` says so (the extension logs it once per generation).

Weights: the webui's LoRA merges the networks into the weights in place, lazily, in each Linear's / Conv's forward
(extensions-builtin/Lora/networks.py, network_apply_weights), which a replay skips. So does the hypernetwork
choice the attention reads, and the "upcast attention" and circular-tiling settings. `webui_state()` is all of
them as one value; when it changes, the graphs are dropped and the next calls run eagerly (the capture's warm-up
applies the new weights) before capturing again.
"""
from __future__ import annotations

import logging
import math
import sys
from collections import Counter

import torch

from ..graphs import GraphedCall, GraphPool

log = logging.getLogger("rocm_sd.a1111")

_UNET_KWARGS = frozenset({"timesteps", "context", "y"})


def webui_module(name: str):
    """A webui module if the webui has imported it (never imports it: rocm_sd must not load the webui)."""
    return sys.modules.get(name)


def webui_state() -> tuple:
    """What the UNet's forward reads from the webui's Python state besides its arguments and weights: the LoRA
    networks loaded (and whether they are computed in the forward), the hypernetworks, the upcast setting and
    circular tiling. A graph captured under one value must not replay under another."""
    shared, networks, hijack = webui_module("modules.shared"), webui_module("networks"), webui_module("modules.sd_hijack")
    opts = getattr(shared, "opts", None)
    lora = tuple((n.name, n.te_multiplier, n.unet_multiplier, n.dyn_dim)
                 for n in getattr(networks, "loaded_networks", None) or ())
    hypernetworks = tuple((getattr(h, "name", id(h)), getattr(h, "multiplier", None))
                          for h in getattr(shared, "loaded_hypernetworks", None) or ())
    circular = getattr(getattr(hijack, "model_hijack", None), "circular_enabled", False)
    return (lora, bool(getattr(opts, "lora_functional", False)), hypernetworks,
            bool(getattr(opts, "upcast_attn", False)), circular)


def webui_blocker(unet, kwargs: dict) -> str | None:
    """Why this UNet call must not replay a graph, or None when it may."""
    extra = set(kwargs) - _UNET_KWARGS
    if extra:
        return f"another extension passes the UNet its own arguments ({', '.join(sorted(extra))})"
    sd_unet = webui_module("modules.sd_unet")
    if getattr(sd_unet, "current_unet", None) is not None:
        return "an SdUnet option (Settings > SD Unet, e.g. TensorRT) replaces the UNet"
    model = getattr(getattr(webui_module("modules.sd_models"), "model_data", None), "sd_model", None)
    if getattr(model, "lowvram", False):
        return "--medvram / --lowvram move the model between CPU and GPU per call"
    if getattr(model, "applied_token_merged_ratio", 0):
        return "token merging (Settings > Optimizations) decides in Python per call"
    return None


class GraphedUNetForward:
    """The webui UNet's forward(x, timesteps=None, context=None, y=None, **kwargs), replayed from a captured graph
    where webui_blocker allows, else run as it is; see the module doc."""

    def __init__(self, unet: torch.nn.Module):
        self.unet = unet
        self.graphed = GraphedCall(self._class_forward, unet, "A1111 UNet forward", pool_owner=GraphPool())
        self.state = None
        self.blocked: Counter = Counter()

    def _class_forward(self, x, timesteps, context, y):
        return type(self.unet).forward(self.unet, x, timesteps, context, y)

    def __call__(self, x, timesteps=None, context=None, y=None, **kwargs):
        why = webui_blocker(self.unet, kwargs)
        if why is not None:
            self._eager(why)
            return type(self.unet).forward(self.unet, x, timesteps, context, y, **kwargs)
        state = webui_state()
        if state != self.state:
            if self.graphed.graphs:
                self.graphed.clear()
                self.blocked["graphs dropped: LoRA, hypernetworks or settings changed"] += 1
            self.state = state
        return self.graphed(x, timesteps, context, y)

    def _eager(self, why: str) -> None:
        if f"eager: {why}" not in self.blocked:  # once per reason
            log.warning("rocm_sd: UNet evaluations without graph replay while %s", why)
        self.blocked[f"eager: {why}"] += 1

    @property
    def stats(self) -> Counter:
        """Graph captures, replays and each reason a call ran eagerly."""
        return self.blocked + self.graphed.stats

    def clear(self) -> None:
        """Drop the captured graphs; their memory returns to PyTorch's allocator."""
        self.graphed.clear()


# ---- generative-models' timestep embedding, which copies from the CPU on every call ---------------------------------
# sgm.modules.diffusionmodules.util.timestep_embedding builds its frequencies on the CPU and copies them to the GPU per
# call: a host copy, which a graph capture refuses, so every SDXL evaluation ran eagerly (seen on the H100). The copy
# below computes them the same way, once per size and device (the same bits), and copies them without waiting (from
# pinned memory), so a capture finds them on the GPU. The webui's own ldm version builds them on the GPU already.
_FREQUENCIES: dict[tuple, torch.Tensor] = {}


def sgm_timestep_embedding(timesteps, dim, max_period=10000, repeat_only=False):
    """generative-models' timestep_embedding, the same arithmetic on the same frequencies, without a copy per call."""
    if repeat_only:  # no frequencies, no copy
        return webui_module("sgm.modules.diffusionmodules.util").timestep_embedding(timesteps, dim, max_period, True)
    half = dim // 2
    key = (half, max_period, timesteps.device)
    freqs = _FREQUENCIES.get(key)
    if freqs is None:
        host = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half)
        if timesteps.is_cuda:
            host = host.pin_memory()
        freqs = _FREQUENCIES[key] = host.to(device=timesteps.device, non_blocking=True)
    args = timesteps[:, None].float() * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


def sgm_timestep_embedding_site():
    """(holder, attribute name) of the function the SDXL UNet calls as generative-models' timestep_embedding: its
    module's global, or the function inside the webui's hijack of it (a CondFunc casting the result), or None where
    neither is that function (another webui version: the capture then fails and the reason is logged)."""
    openaimodel = webui_module("sgm.modules.diffusionmodules.openaimodel")
    util = webui_module("sgm.modules.diffusionmodules.util")
    if openaimodel is None or util is None:
        return None
    holder, name = openaimodel, "timestep_embedding"
    for _ in range(4):  # the webui stacks at most a couple of CondFuncs
        current = getattr(holder, name)
        if current is util.timestep_embedding:
            return holder, name
        cells = [cell.cell_contents for cell in getattr(current, "__closure__", None) or ()]
        hijack = next((c for c in cells if type(c).__name__ == "CondFunc"), None)
        if hijack is None or not hasattr(hijack, "_CondFunc__orig_func"):
            return None
        holder, name = hijack, "_CondFunc__orig_func"
    return None


def hooked_by_another(unet) -> bool:
    """Whether something else (sd-webui-controlnet's UnetHook) has replaced a graphed UNet's forward: its steps
    then run its own forward, eagerly."""
    forward = unet.__dict__.get("forward")
    return forward is not None and not isinstance(forward, GraphedUNetForward) and any(
        isinstance(v, GraphedUNetForward) for v in unet.__dict__.values())
