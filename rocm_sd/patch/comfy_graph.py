"""Graph capture of a ComfyUI model's evaluation (the sampler's `apply_model` call), per input signature.

Why: ComfyUI runs the UNet eagerly, and on a fast GPU a sampling step is bound by host time (bench/notes/comfyui.md); launches cost more on
ROCm than on CUDA. Replayed as one graph, the step costs its kernels' time.

How: installed as the patcher's `model_function_wrapper` (ComfyUI's sampler calls every model evaluation
through it; every ComfyUI and Forge have it), it hands each call to a GraphedCall of the model's
`apply_model` (rocm_sd/graphs.py: one graph per signature of tensor shapes and dtypes, the other argument
values and the weights' storage; inputs are copied in, outputs cloned out). A graph replays the Python
decisions of its capture, so a call runs eagerly, its reason counted in `stats`, whenever something in it
may decide differently from call to call:
- transformer patches or replace patches (other nodes' Python hooks: FreeU, IPAdapter, ...), except
  rocm_sd's own attention replace patch;
- a wrapper that runs inside apply_model (APPLY_MODEL, DIFFUSION_MODEL, or a kind this code does not know);
- ComfyUI streaming weights from the CPU per call (its low-VRAM mode);
- whatever GraphedCall itself refuses (autograd on, CPU tensors, unhashable arguments, a host sync...).
Keys of transformer_options that the model's forward does not read (the sampler's per-run uuids and
sigma schedule, the per-block bookkeeping the forward writes itself) are left out of the graphed call, so a
new sampling run or another step count does not capture again.

Weights: LoRA through ComfyUI's weight patching replaces the parameters (new storage: a new signature,
captured again); hook keyframes copy into them in place (the graph reads the new values). When ComfyUI
unloads the model and its weights (its ON_DETACH callback with unpatch_all, where the running ComfyUI has
callbacks) the graphs are dropped and their memory returns to PyTorch's allocator.
"""
from __future__ import annotations

import functools
import logging
from collections import Counter

import torch
from torch.utils import _pytree as pytree

from ..graphs import GraphedCall, GraphPool
from ..modules.comfy_dit_cache import ComfyDiTStepCache
from ..modules.step_cache import ComfyStepCache

log = logging.getLogger("rocm_sd.comfyui")

# transformer_options entries the sampler adds per call or per run, or that the UNet's forward writes before
# it reads them; none of them changes what a call computes when no patch or wrapper runs inside it.
_NOT_READ_BY_FORWARD = frozenset({"uuids", "sample_sigmas", "wrappers", "callbacks", "original_shape",
                                  "transformer_index", "block", "block_index", "activations_shape"})
# Wrapper kinds that run around, not inside, apply_model (comfy/patcher_extension.py, WrappersMP).
_WRAP_OUTSIDE_APPLY_MODEL = frozenset({"outer_sample", "prepare_sampling", "sampler_sample", "predict_noise",
                                       "calc_cond_batch"})
# The step caches the node installs: the UNets' (deepcache / adaptive) and the transformers' (fbcache / teacache).
STEP_CACHES = (ComfyStepCache, ComfyDiTStepCache)


def graph_blocker(model, conditioning: dict, own_replace_patch=None) -> str | None:
    """Why this model call must not replay a graph, or None when it may."""
    if model is None:
        return "apply_model is not a bound method of a model"
    if getattr(model, "model_lowvram", False):
        return "ComfyUI streams weights from the CPU per call (low-VRAM mode)"
    options = conditioning.get("transformer_options") or {}
    for name, patches in (options.get("patches") or {}).items():
        if patches:
            return f"a '{name}' transformer patch runs Python inside the model"
    for name, replaces in (options.get("patches_replace") or {}).items():
        if any(patch is not own_replace_patch for patch in replaces.values()):
            return f"a '{name}' replace patch of another node runs Python inside the model"
    for kind, keyed in (options.get("wrappers") or {}).items():
        if kind not in _WRAP_OUTSIDE_APPLY_MODEL and any(keyed.values()):
            return f"a '{kind}' wrapper runs inside the model call"
    return None


def _graphed_conditioning(conditioning: dict, device: torch.device) -> dict:
    """The conditioning as the graphed call takes it: its tensors on `device` (ComfyUI's sampler hands them over
    on the CPU and apply_model moves them itself, with cast_to_device: a graph replays device memory only, so
    they move before the call, to the same values), and transformer_options without the keys the forward does
    not read."""
    def to_device(t: torch.Tensor) -> torch.Tensor:
        return t if t.device == device else t.to(device)

    graphed = {k: v if k == "transformer_options" else pytree.tree_map_only(torch.Tensor, to_device, v)
               for k, v in conditioning.items()}
    options = conditioning.get("transformer_options")
    if options is not None:
        graphed["transformer_options"] = {k: v for k, v in options.items() if k not in _NOT_READ_BY_FORWARD}
    return graphed


class GraphedModelFunction:
    """ComfyUI's model_function_wrapper(apply_model, {"input", "timestep", "c", "cond_or_uncond"}): the call
    replayed from a captured graph where graph_blocker allows, else run as it is; see the module doc."""

    def __init__(self, own_replace_patch=None, step_cache: ComfyStepCache | ComfyDiTStepCache | None = None):
        self.own_replace_patch = own_replace_patch
        self.pool = GraphPool()
        self.graphed: GraphedCall | None = None
        self.blocked: Counter = Counter()
        # With a step cache, its deciding runs here, eagerly, and each of its calls (its GRAPHED_CALLS: the UNet
        # cache's full call, which returns the output and the cached feature, and partial call, which takes the
        # feature; the transformers' head, rest, skip and plain calls) is its own graphed call, with the options its
        # GRAPH_OPTIONS give (buffers passed in place).
        self.step_cache = step_cache
        self.step_graphs: dict[str, GraphedCall] = {}

    def __deepcopy__(self, memo):
        # ModelPatcher.clone() deep-copies model_options. Clones of one patcher share the model, so they share
        # its graphs too (the weights' storage is part of every signature: a clone with a LoRA captures anew).
        return self

    def __call__(self, apply_model, args: dict):
        x, timestep, conditioning = args["input"], args["timestep"], args["c"]
        model = getattr(apply_model, "__self__", None)
        why = graph_blocker(model, conditioning, self.own_replace_patch)
        if why is None and any(call.module is not model for call in self._calls()):
            why = "another model than the one graphed first"  # clones share one model; never seen in ComfyUI
        if why is not None:
            if f"eager: {why}" not in self.blocked:  # once per reason: why this model's steps are not replayed
                log.info("rocm_sd: ComfyUI model evaluations without graph replay while %s", why)
            self.blocked[f"eager: {why}"] += 1
            if getattr(model, "model_lowvram", False) and any(call.graphs for call in self._calls()):
                # ComfyUI offloaded part of the model to make room: the graphs' weights are gone from where they
                # were, and their activations hold memory the partially loaded model now needs.
                self.clear()
                self.blocked["graphs dropped: ComfyUI moved to low-VRAM mode"] += 1
            if self.step_cache is not None:
                return self.step_cache(apply_model, args)
            return apply_model(x, timestep, **conditioning)
        if self.step_cache is not None:
            return self.step_cache(apply_model, args, **{name: functools.partial(self._graphed_step, name)
                                                         for name in self.step_cache.GRAPHED_CALLS})
        if self.graphed is None:
            self.graphed = GraphedCall(lambda x, t, c: model.apply_model(x, t, **c), model, "ComfyUI apply_model",
                                       pool_owner=self.pool)
        return self.graphed(x, timestep, _graphed_conditioning(conditioning, x.device))

    def _calls(self) -> list[GraphedCall]:
        return ([self.graphed] if self.graphed is not None else []) + list(self.step_graphs.values())

    def _step_graph(self, name: str, model) -> GraphedCall:
        call = self.step_graphs.get(name)
        if call is None:
            options = getattr(self.step_cache, "GRAPH_OPTIONS", {}).get(name, {})
            call = self.step_graphs[name] = GraphedCall(functools.partial(getattr(self.step_cache, name), model), model,
                                                        f"ComfyUI apply_model ({name})", pool_owner=self.pool,
                                                        **options)
        return call

    def _graphed_step(self, name: str, model, x, timestep, conditioning, *args, **kwargs):
        """The step cache's call `name`, graphed: (model, x, t, c, the call's own arguments)."""
        return self._step_graph(name, model)(x, timestep, _graphed_conditioning(conditioning, x.device), *args,
                                             **kwargs)

    @property
    def stats(self) -> Counter:
        """Graph captures, replays and each reason a call ran eagerly, since installation; with a step cache, its
        counts and its two calls' graph statistics ('full: graph replays', 'partial: graph replays')."""
        stats = self.blocked + (self.graphed.stats if self.graphed is not None else Counter())
        for name, call in self.step_graphs.items():
            stats.update({f"{name}: {what}": n for what, n in call.stats.items()})
        return stats + (self.step_cache.stats if self.step_cache is not None else Counter())

    def clear(self) -> None:
        """Drop the captured graphs; their memory returns to PyTorch's allocator."""
        for call in self._calls():
            call.clear()

    def on_detach(self, _patcher, unpatch_all: bool) -> None:
        """ComfyUI's ON_DETACH callback. Every sampling run detaches and reloads the model it samples with,
        weights left in place (unpatch_all False: load_models_gpu unloads "clones" of the model it loads, the
        model itself among them); the graphs stay valid then. unpatch_all True: the model is unloaded, and the step
        cache's kept features or residuals go with the graphs."""
        if unpatch_all:
            self.clear()
            if self.step_cache is not None:
                self.step_cache.forget()


def install_graphs(patcher, own_replace_patch=None, step_cache=None) -> str | None:
    """Set a GraphedModelFunction (around `step_cache`, where one is given) as `patcher`'s model_function_wrapper;
    the reason when it cannot be."""
    return _install_wrapper(patcher, GraphedModelFunction(own_replace_patch, step_cache))


def install_step_cache(patcher, step_cache) -> str | None:
    """Without graphs: the step cache itself as `patcher`'s model_function_wrapper; the reason when it cannot be."""
    return _install_wrapper(patcher, step_cache)


def _install_wrapper(patcher, wrapper) -> str | None:
    existing = patcher.model_options.get("model_function_wrapper")
    if isinstance(existing, (GraphedModelFunction, *STEP_CACHES)):
        return None  # the node ran on its own output: its wrapper already runs every evaluation
    if existing is not None:
        return "another node already set this model's model_function_wrapper (ComfyUI keeps one)"
    patcher.set_model_unet_function_wrapper(wrapper)
    add_callback = getattr(patcher, "add_callback", None)
    if hasattr(wrapper, "on_detach") and add_callback is not None:
        # ComfyUI since 2024-12; older ones keep the graphs until the node is re-run
        try:
            from comfy.patcher_extension import CallbacksMP
        except ImportError:
            return None
        add_callback(CallbacksMP.ON_DETACH, wrapper.on_detach)
    return None


def installed_step_cache(patcher) -> ComfyStepCache | ComfyDiTStepCache | None:
    """The step cache every evaluation of `patcher` runs through (install_graphs' or install_step_cache's), or None."""
    wrapper = patcher.model_options.get("model_function_wrapper")
    return wrapper.step_cache if isinstance(wrapper, GraphedModelFunction) else \
        wrapper if isinstance(wrapper, STEP_CACHES) else None


def step_cache_notice(step_cache: ComfyStepCache | ComfyDiTStepCache) -> str:
    """What the node says of an active step cache: that it is on, its setting, and that images change."""
    if isinstance(step_cache, ComfyDiTStepCache):
        probe = "first block's residual" if step_cache.mode == "fbcache" else "first block's modulated input"
        rest = "the blocks after the first" if step_cache.mode == "fbcache" else "all blocks"
        published = ", the published default for this model" if step_cache.published else ""
        return (f"step cache '{step_cache.mode}' active (threshold {step_cache.threshold:g}{published}): an "
                f"evaluation whose {probe} changed less than that skips {rest} and adds their kept residual, so "
                f"images differ from the model's own (docs/step_cache.md)")
    schedule = step_cache.schedule
    setting = (f"one full evaluation in {schedule.interval}" if schedule.mode == "deepcache"
               else f"a full evaluation when the input moved by {schedule.threshold:g}")
    return (f"step cache '{schedule.mode}' active ({setting}, cache_branch {step_cache.branch}): the other "
            f"evaluations reuse cached deep features, so images differ from the model's own (docs/step_cache.md)")


def graph_stats(patcher) -> Counter:
    """The statistics of the wrapper install_graphs or install_step_cache put on `patcher` (empty when it has none):
    graph captures, replays and eager calls, and the step cache's counts."""
    wrapper = patcher.model_options.get("model_function_wrapper")
    return Counter(wrapper.stats) if isinstance(wrapper, (GraphedModelFunction, *STEP_CACHES)) else Counter()
