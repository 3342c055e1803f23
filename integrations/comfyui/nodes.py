"""ComfyUI nodes: "rocm_sd Optimize Model" (MODEL -> MODEL), "rocm_sd Optimize VAE" (VAE -> VAE) and
"rocm_sd Tune" (MODEL -> MODEL, unchanged: tunes the kernels for the model's shapes, and runs its convolution and GEMM
problems once so that MIOpen's first-run search is done before the first image).

A thin shim (docs/design.md, convention 10): node definitions around rocm_sd.patch.comfy, which the
AUTOMATIC1111 extension's Forge path shares. The norm modules become kernel-backed copies of themselves
through the patcher's object patches, so ComfyUI's own load/unload, offload, LoRA weight patching and
low-VRAM casting keep working and the input model is never touched; attention goes through ComfyUI's
per-model override where the running ComfyUI has it (feature-detected), else attn1/attn2 replace patches;
each model evaluation replays a captured graph through the patcher's model_function_wrapper.
Without rocm_sd (or without its kernels) the nodes pass the model through and say why, once. What a node declines or
turns on that changes images (step caching) it says at every execution, each line once per execution.
"""
from __future__ import annotations

import copy
import logging

log = logging.getLogger("rocm_sd.comfyui")

try:
    import torch

    from rocm_sd.patch.comfy import (conv_swaps, model_architecture, model_paths, norm_swaps, patch_model_patcher,
                                     upsample_swaps, vae_attention, vae_tile_swaps)
    from rocm_sd.patch.comfy_graph import installed_step_cache, step_cache_notice
    UNAVAILABLE = None
except ImportError as exc:  # the node must load in any ComfyUI, even one without rocm_sd installed
    UNAVAILABLE = f"rocm_sd is not importable ({exc}); install it into ComfyUI's Python environment"

CATEGORY = "rocm_sd"
_said = set()


def _say_once(message: str) -> None:
    """For facts of the session (rocm_sd or its kernels missing): said at the first execution only."""
    if message not in _said:
        _said.add(message)
        log.warning("rocm_sd: %s", message)


def _say(messages: list[str]) -> None:
    """For what one execution declined or turned on: said at every execution (a user who changes an option sees what
    it did), each distinct line once."""
    for message in dict.fromkeys(messages):
        log.warning("rocm_sd: %s", message)


# ---- the nodes ---------------------------------------------------------------------------------------------

class RocmSDOptimizeModel:
    """MODEL -> MODEL: rocm_sd's norm kernels (SD3 / SD3.5 and Flux: its fused transformer blocks) and attention on a
    clone, and its evaluations replayed as captured graphs; optionally step caching (docs/step_cache.md), 8-bit linear layers and FP8 attention
    (docs/precision.md); the input model is not changed."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL",),
            "attention": ("BOOLEAN", {"default": True, "tooltip": "attention through rocm_sd"}),
            "group_norm": ("BOOLEAN", {"default": True, "tooltip": "GroupNorm (+ the SiLU after it) as one kernel"}),
            "layer_norm": ("BOOLEAN", {"default": True, "tooltip": (
                "the transformer blocks' LayerNorms; on SD3 / SD3.5 and Flux, each block's AdaLN, Q / K RMSNorm "
                "(+ rope) and GELU MLP")}),
            "channels_last": ("BOOLEAN", {"default": True, "tooltip": (
                "run the convolutions on channels_last views of their weights, so that activations stay NHWC and "
                "the GPU's convolutions need no layout transposes (ComfyUI keeps models NCHW)")}),
            "cuda_graph": ("BOOLEAN", {"default": True, "tooltip": (
                "replay each model evaluation as one captured GPU graph (HIP graph on AMD) per input shape: "
                "the host cost of hundreds of launches per step goes. Needs VRAM for the graph's activations; "
                "calls with other nodes' patches, or in low-VRAM mode, run as usual")}),
        }, "optional": {
            "cache": (["off", "deepcache", "adaptive", "fbcache", "teacache"], {"default": "off", "tooltip": (
                "step caching (changes images). UNets (SD1.x / SD2.x / SDXL): 'deepcache' runs one model evaluation "
                "in cache_interval in full and the others through the outermost blocks only, reusing the deep "
                "features; 'adaptive' runs one in full whenever the input has changed by cache_threshold since the "
                "last full one. SD3 / SD3.5 and Flux: 'fbcache' (First Block Cache) skips the blocks after the first "
                "where the first block's residual changed less than dit_cache_threshold, 'teacache' all blocks where "
                "the first block's modulated input did, adding the skipped blocks' kept residual")}),
            "cache_interval": ("INT", {"default": 3, "min": 1, "max": 100,
                                       "tooltip": "deepcache: one full evaluation per this many steps"}),
            "cache_threshold": ("FLOAT", {"default": 0.15, "min": 0.0, "max": 10.0, "step": 0.01, "tooltip": (
                "adaptive: the summed relative change of the model's input that triggers a full evaluation "
                "(fbcache / teacache take dit_cache_threshold)")}),
            "precision": (["fp16", "fp8", "int8"], {"default": "fp16", "tooltip": (
                "8-bit linear layers (changes images): 'fp8' (MI300 / MI350, RDNA4, NVIDIA Ada and newer) or 'int8' "
                "runs the attention projections, feed-forward and 1x1 convolutions (SD3 / SD3.5 and Flux: the "
                "transformer blocks' linear layers but their AdaLN modulation) as 8-bit GEMMs, weights "
                "quantized per output channel from the model's current weights (LoRA included), activations per "
                "token. The 8-bit weights are held beside ComfyUI's own: about half the linear layers' fp16 size "
                "more VRAM, which ComfyUI's memory estimate does not see. 'fp16' keeps the model's dtype")}),
            # new inputs go last: ComfyUI restores a saved workflow's widget values by position
            "cache_branch": ("INT", {"default": 0, "min": 0, "max": 8, "tooltip": (
                "deepcache / adaptive: how much of the outermost level the other evaluations run (DeepCache's "
                "cache_branch_id): 0 only the last output block (fastest), 1 also the first input block and its "
                "mirror, 2 the whole outermost level (SD1.x/2.x/SDXL); higher is slower and closer to full")}),
            "precision_layers": (["measured", "all"], {"default": "measured", "tooltip": (
                "fp8 / int8: 'measured' keeps a layer in fp16 where the tuning database measured its fp16 GEMM "
                "faster (shipped for NVIDIA Hopper; `python -m rocm_sd.tune --model sdxl --precision fp8 --ops "
                "linear_8bit` measures your GPU; unmeasured layers stay 8-bit); 'all': every layer 8-bit")}),
            "attention_precision": (["fp16", "fp8"], {"default": "fp16", "tooltip": (
                "'fp8' (changes images; MI300 / MI350, RDNA4, NVIDIA Ada and newer): attention with Q, K, V and the "
                "probabilities in FP8 and an fp32 softmax, at the shapes where `python -m rocm_sd.tune "
                "--attention-precision fp8 --ops attention_fp8` measured it faster on this GPU; fp16 elsewhere. "
                "Needs the attention option")}),
            "dit_cache_threshold": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 10.0, "step": 0.01, "tooltip": (
                "fbcache / teacache: the relative change under which an evaluation is skipped; higher skips more. "
                "-1: the published default for the model (fbcache 0.08 on Flux, 0.12 on SD3 / SD3.5; teacache 0.4 on "
                "Flux, 0.3 on SD3 / SD3.5); 0: every evaluation in full")}),
        }}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "optimize"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Runs the model's GroupNorm+SiLU, LayerNorm (SD3 / Flux: AdaLN, Q / K RMSNorm) and attention "
                   "through rocm_sd and replays each model evaluation as a captured GPU graph (AMD GPUs).")

    def optimize(self, model, attention=True, group_norm=True, layer_norm=True, cuda_graph=True, channels_last=True,
                 cache="off", cache_interval=3, cache_threshold=0.15, precision="fp16", cache_branch=0,
                 precision_layers="measured", attention_precision="fp16", dit_cache_threshold=-1.0):
        if UNAVAILABLE:
            _say_once(UNAVAILABLE + "; the model passes through unchanged")
            return (model,)
        patched = model.clone()
        cache = None if cache == "off" else cache
        not_installed = patch_model_patcher(patched, attention, group_norm, layer_norm, cuda_graph=cuda_graph,
                                            channels_last=channels_last, cache=cache, cache_interval=cache_interval,
                                            cache_threshold=cache_threshold, precision=precision,
                                            cache_branch=cache_branch, precision_layers=precision_layers,
                                            attention_precision=attention_precision,
                                            dit_cache_threshold=(None if dit_cache_threshold < 0
                                                                 else dit_cache_threshold))
        step_cache = installed_step_cache(patched)
        _say(not_installed + ([step_cache_notice(step_cache)] if step_cache is not None else []))
        _report_kernels()
        return (patched,)


class RocmSDOptimizeVAE:
    """VAE -> VAE: the decoder's GroupNorms and its attention through rocm_sd (the VAE's attention does
    not go through the model override), and each upsampler's nearest 2x + 3x3 convolution folded into one
    2x2 convolution at the low resolution; the input VAE is not changed."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "vae": ("VAE",),
            "attention": ("BOOLEAN", {"default": True}),
            "group_norm": ("BOOLEAN", {"default": True}),
            "fold_upsample": ("BOOLEAN", {"default": True}),
            "channels_last": ("BOOLEAN", {"default": True}),
        }, "optional": {
            "fixed_tiles": (["auto", "on", "off"], {"default": "auto", "tooltip": (
                "decode latents of 64 or more a side in tiles of 64, 96 or 128 latents, blended, so that every image "
                "size runs the same convolution problems and MIOpen's first-run search (minutes at each new size) runs "
                "once per tile shape; tiles differ slightly from an untiled decode (docs/amd.md). auto: on with "
                "ROCm's torch")}),
        }}

    RETURN_TYPES = ("VAE",)
    FUNCTION = "optimize"
    CATEGORY = CATEGORY
    DESCRIPTION = "Runs the VAE's GroupNorms, attention and upsamplers through rocm_sd (AMD GPUs)."

    def optimize(self, vae, attention=True, group_norm=True, fold_upsample=True, channels_last=True,
                 fixed_tiles="auto"):
        if UNAVAILABLE:
            _say_once(UNAVAILABLE + "; the VAE passes through unchanged")
            return (vae,)
        patched = copy.copy(vae)
        patched.patcher = vae.patcher.clone()
        root, resolve = vae.first_stage_model, model_paths(vae.patcher)
        for path, module in norm_swaps(root, group_norm, layer_norm=False, resolve=resolve).items():
            patched.patcher.add_object_patch(path, module)
        upsamplers = upsample_swaps(root, resolve) if fold_upsample else {}
        for path, module in upsamplers.items():
            patched.patcher.add_object_patch(path, module)
        for path, module in (conv_swaps(root, upsamplers, resolve) if channels_last else {}).items():
            patched.patcher.add_object_patch(path, module)
        if attention:
            for name, module in root.named_modules():
                if callable(getattr(module, "optimized_attention", None)):
                    patched.patcher.add_object_patch(f"{name}.optimized_attention", vae_attention)
        if _fixed_tiles(fixed_tiles):
            for path, patch in vae_tile_swaps(root).items():
                patched.patcher.add_object_patch(path, patch)
        _report_kernels()
        return (patched,)


class RocmSDTune:
    """MODEL -> MODEL (unchanged): tunes rocm_sd's kernels on this GPU for the model's architecture at one size,
    as `python -m rocm_sd.tune` does (random weights of the same shapes; results written to the tuning
    database the other nodes read, as they come); then, with `prepare`, runs every convolution and GEMM problem of the
    model at that size once in this process (rocm_sd.prepare: MIOpen's find, TunableOp, cuDNN's benchmark mode).
    ComfyUI's loaded models are unloaded first to give the tuner the GPU. Progress is shown in the console."""

    @classmethod
    def INPUT_TYPES(cls):
        size = {"default": 1024, "min": 64, "max": 8192, "step": 8}
        return {"required": {
            "model": ("MODEL",),
            "width": ("INT", size),
            "height": ("INT", size),
            "batch_size": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "images per KSampler call"}),
            "budget_minutes": ("INT", {"default": 10, "min": 0, "max": 600,
                                       "tooltip": "start no new problem after this long (0: no limit)"}),
            "resume": ("BOOLEAN", {"default": True, "tooltip": "skip what the database already holds"}),
        }, "optional": {
            "precision": (["fp16", "fp8", "int8"], {"default": "fp16", "tooltip": (
                "fp8 / int8: tune the model as the Optimize node's precision runs it, and time each 8-bit layer "
                "against fp16 (what its precision_layers 'measured' follows)")}),
            "prepare": ("BOOLEAN", {"default": True, "tooltip": (
                "also run every convolution and GEMM problem of the model at this size once, so that MIOpen's "
                "first-run search (minutes on ROCm) is done before the first image (docs/amd.md)")}),
        }}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "tune"
    CATEGORY = CATEGORY
    DESCRIPTION = "Tunes rocm_sd's kernels for this model's shapes on this GPU, once (minutes); later runs use it."

    def tune(self, model, width=1024, height=1024, batch_size=1, budget_minutes=10, resume=True, precision="fp16",
             prepare=True):
        if UNAVAILABLE:
            _say_once(UNAVAILABLE + "; nothing tuned")
            return (model,)
        try:
            arch = model_architecture(model)
        except ValueError as error:
            _say([f"nothing tuned: {error}"])
            return (model,)
        argv = ["--model", arch, "--width", str(width), "--height", str(height), "--batch", str(batch_size)]
        argv += (["--resume"] if resume else []) + (["--budget-s", str(60 * budget_minutes)] if budget_minutes else [])
        argv += ["--precision", precision] if precision != "fp16" else []
        _free_the_gpu()
        from rocm_sd.tune import cli as tune_cli

        status = tune_cli.main(argv)
        if status:
            _say([f"tuning stopped (python -m rocm_sd.tune {' '.join(argv)} exited {status}); see the log above"])
        if prepare:
            _prepare(arch, width, height, batch_size)
        return (model,)


def _fixed_tiles(choice: str) -> bool:
    """The VAE node's fixed_tiles: auto follows optimize()'s vae_tiles default (on with ROCm's torch)."""
    if choice == "auto":
        from rocm_sd.patch.flags import FLAGS

        return next(f for f in FLAGS if f.name == "vae_tiles").default_for({})
    return choice == "on"


def _prepare(arch: str, width: int, height: int, batch_size: int) -> None:
    from rocm_sd import platform
    from rocm_sd import prepare

    if not platform.gpu_available():
        _say(["nothing prepared: no GPU, so no convolution search to run ahead"])
        return
    try:  # the VAE as ComfyUI's own VAE Decode runs it (untiled), and as the VAE node's fixed tiles do where auto is on
        for vae_tiles in (False, True)[:1 + _fixed_tiles("auto")]:
            prepare.run(arch, [(width, height)], batch=batch_size, vae_tiles=vae_tiles)
    except Exception as error:  # noqa: BLE001 - a failed warm-up must not stop the workflow
        _say([f"prepare stopped ({type(error).__name__}: {error}); the first image will search as usual"])


def _free_the_gpu() -> None:
    try:
        import comfy.model_management as model_management
    except ImportError:
        return
    for name in ("unload_all_models", "soft_empty_cache"):
        getattr(model_management, name, lambda: None)()


def _report_kernels() -> None:
    """Say once when the kernels cannot run here (no GPU build, no GPU): the ops then use PyTorch."""
    from rocm_sd import _ext

    reason = _ext.LOAD_ERROR if _ext._C is None else None
    if reason is None and torch.cuda.is_available():
        reason = _ext.unavailable_reason(torch.device("cuda"))
    if reason:
        _say_once(f"kernels unavailable ({reason}); the patched model runs rocm_sd's PyTorch reference path")


NODE_CLASS_MAPPINGS = {"RocmSDOptimizeModel": RocmSDOptimizeModel, "RocmSDOptimizeVAE": RocmSDOptimizeVAE,
                       "RocmSDTune": RocmSDTune}
NODE_DISPLAY_NAME_MAPPINGS = {"RocmSDOptimizeModel": "rocm_sd Optimize Model",
                              "RocmSDOptimizeVAE": "rocm_sd Optimize VAE", "RocmSDTune": "rocm_sd Tune"}
