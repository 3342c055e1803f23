"""optimize(pipe) / revert(pipe): apply rocm_sd to a diffusers pipeline, or to one model."""
from __future__ import annotations

import logging

import torch
from torch import nn

from ..graphs import GraphedCall, GraphPool
from ..modules.hooks import accelerate_hooked
from .attention import patch_attention
from .core import RECORD_ATTR, PatchRecord
from .geglu import patch_geglus
from .group_norm import patch_group_norms
from .layer_norm import patch_layer_norms
from .layout import patch_transformer_layouts
from .pointwise import patch_pointwise_convs
from .resnet import patch_resnets
from .transformer import patch_transformer_blocks
from .upsample import patch_upsamplers

log = logging.getLogger("rocm_sd")

# Pipeline attributes that hold models rocm_sd knows how to patch, and the model classes it accepts.
COMPONENTS = ("unet", "vae", "controlnet", "text_encoder", "text_encoder_2")
DIFFUSION_MODELS = {"UNet2DConditionModel", "UNet2DModel", "AutoencoderKL", "ControlNetModel"}
# transformers' CLIP encoders (SD1.x/2.x and both of SDXL's): their LayerNorms and a graphed forward.
# Encoding a prompt is a few hundred small launches, host-bound like a UNet step, once per prompt.
TEXT_ENCODERS = {"CLIPTextModel", "CLIPTextModelWithProjection"}
KNOWN_MODELS = DIFFUSION_MODELS | TEXT_ENCODERS


def _models(target) -> dict[str, nn.Module]:
    if isinstance(target, nn.Module):
        return {type(target).__name__: target}
    found = {}
    for name in COMPONENTS:
        model = getattr(target, name, None)
        if isinstance(model, nn.Module):
            found[name] = model
    return found


# The calls graph capture wraps per model class: (method, keyword arguments the method ignores).
# AutoencoderKL.decode takes the pipeline's `generator` and does not use it.
GRAPHED_CALLS = {
    "UNet2DConditionModel": [("forward", ())],
    "UNet2DModel": [("forward", ())],
    "ControlNetModel": [("forward", ())],
    "AutoencoderKL": [("decode", ("generator",))],
    "CLIPTextModel": [("forward", ())],
    "CLIPTextModelWithProjection": [("forward", ())],
}


OFFLOAD_FIRST = ("skipped: accelerate hooks on its modules (sequential CPU offload); call rocm_sd.optimize() "
                 "before enable_sequential_cpu_offload()")


def _untouched(target) -> dict[str, nn.Module]:
    """A pipeline's models that optimize() does not patch (safety checker, image encoder, ...)."""
    components = getattr(target, "components", None)
    if isinstance(target, nn.Module) or not isinstance(components, dict):
        return {}
    return {name: model for name, model in components.items()
            if isinstance(model, nn.Module) and name not in COMPONENTS}


def _install_graphs(model: nn.Module, record: PatchRecord, pool: GraphPool) -> None:
    for method, ignored in GRAPHED_CALLS.get(type(model).__name__, []):
        call = GraphedCall(getattr(model, method), model, f"{type(model).__name__}.{method}", ignored, pool)
        record.set_attr(model, method, call)
        record.graphed[method] = call
        record.counts[f"graphed: {method}"] += 1


def _to_channels_last(model: nn.Module, record: PatchRecord) -> None:
    model.to(memory_format=torch.channels_last)
    record.on_revert(model.to, memory_format=torch.contiguous_format)
    record.counts["channels_last"] += 1
    patch_transformer_layouts(model, record)


def _unfuse_qkv(model: nn.Module, added: list[tuple[nn.Module, str]]) -> None:
    model.unfuse_qkv_projections()  # restores the processors, but leaves the fused Linear modules
    for module, name in added:
        delattr(module, name)
        if hasattr(module, "fused_projections"):
            module.fused_projections = False


def _fuse_qkv(model: nn.Module, record: PatchRecord) -> None:
    fuse = getattr(model, "fuse_qkv_projections", None)
    if fuse is None:
        return
    before = {id(m): set(m._modules) for m in model.modules()}
    fuse()
    added = [(m, name) for m in model.modules() if id(m) in before for name in set(m._modules) - before[id(m)]]
    record.on_revert(_unfuse_qkv, model, added)
    record.counts["fused qkv"] += 1


def optimize(target, *, group_norm: bool = True, fuse_resnet: bool = True, layer_norm: bool = True,
             fuse_transformer: bool = True, geglu: bool = True, channels_last: bool = True, pointwise_gemm: bool = True,
             fold_upsample: bool = True, fuse_qkv: bool = False,
             attention: bool = True, text_encoder: bool = True, cuda_graph: bool = True):
    """Make a diffusers pipeline (or one of its models) use rocm_sd kernels; returns `target`.

    Flags, one per optimization, each can be turned off:
      group_norm  GroupNorm (+ the SiLU that follows it) -> rocm_sd::group_norm. Exact same math;
                  statistics in fp32, so fp16 results differ from PyTorch's by rounding only.
      fuse_resnet ResnetBlock2D's conv biases, time embedding, residual add and scale folded into its
                  GroupNorm (input bias) and one bias+residual kernel (patch/resnet.py); needs group_norm.
                  Additions in another order: results differ from PyTorch's by rounding. In builds with
                  Composable Kernel instances (ROCm), conv2 and its tail go through rocm_sd::conv_bias_residual,
                  where the tuner may pick a CK convolution with bias and residual in its epilogue.
      layer_norm  nn.LayerNorm over the last dimension (the transformer blocks' norms) -> rocm_sd::layer_norm.
      fuse_transformer  BasicTransformerBlock's residual adds after self- and cross-attention folded into
                  the LayerNorm that follows each (rocm_sd::add_layer_norm, patch/transformer.py); needs
                  layer_norm. Same math and rounding.
      geglu       the feed-forward's GEGLU epilogue (chunk, gelu, multiply) -> rocm_sd::geglu, one kernel. In
                  builds with Composable Kernel instances (ROCm), projection and epilogue go through
                  rocm_sd::linear_geglu, where the tuner may pick CK GEMMs with the epilogue fused.
      channels_last  convolution weights (and so activations) in NHWC: cuDNN/MIOpen run NHWC
                  convolutions without converting, rocm_sd's GroupNorm keeps the layout, and the
                  transformer blocks hand back channels_last without a copy (patch/layout.py).
                  Turn it off with group_norm: PyTorch's own channels_last GroupNorm is slow enough that
                  channels_last with group_norm=False decodes slower than eager (VAE 512x512 27.0 vs
                  20.9 ms on the H200, bench/results/2026-11-21-vae-decode-c44c9e4-h200.md).
      pointwise_gemm  1x1 convolutions (SD1.x's proj_in/proj_out, resnet shortcuts) on channels_last
                  activations as one GEMM with the bias fused, instead of a convolution and a separate
                  bias add (patch/pointwise.py). Different summation order: rounding-level differences.
      fold_upsample  Upsample2D's nearest 2x upsampling and the 3x3 convolution after it (the UNet's and the
                  VAE decoder's up blocks) as one 2x2 convolution at the input resolution plus a pixel
                  shuffle: 2.25x fewer multiply-adds, no 4x intermediate (patch/upsample.py). Rounding-level
                  differences (the folded kernels are sums of the 3x3 taps).
      fuse_qkv    one projection for Q, K and V of self-attention (diffusers' fuse_qkv_projections).
                  Off by default: it adds `to_qkv` weights (state-dict keys, memory) while optimized.
      attention   diffusers' AttnProcessor2_0 (and its fused-QKV variant) -> RocmAttnProcessor, the same
                  steps with the attention through rocm_sd::attention on [B, L, H, D] views (no transpose
                  copies; the output is already the projection's layout). Per shape it runs rocm_sd's
                  flash-attention kernel where `python -m rocm_sd.tune` measured it faster, else PyTorch's
                  SDPA; on the H200 it is 0.340 vs 0.348 s per SD1.5 image with SDPA throughout
                  (bench/results/2026-11-21-sd15-51cf360-h200.md).
      text_encoder  the CLIP text encoder(s) too: their LayerNorms (with layer_norm) and a graphed
                  forward (with cuda_graph). Their attention stays transformers' own (causal SDPA).
      cuda_graph  the UNet / ControlNet step and the VAE decode replay a captured CUDA/HIP graph per
                  input shape (rocm_sd/graphs.py): the host cost of hundreds of launches per step goes.
                  Calls that cannot be graphed (autograd on, CPU tensors, torch.compile tracing...)
                  run eagerly; report() says how often and why. After changing a model in ways
                  rocm_sd cannot see (e.g. a LoRA scale), call invalidate_graphs(target).
    Ops fall back to PyTorch per call where a kernel cannot run (CPU tensors, unsupported dtype...);
    `rocm_sd.stats()` counts which backend ran. `report(target)` says what was replaced.
    Unknown components (a safety checker, an image encoder, a model class rocm_sd does not know) are
    left untouched and listed as such in the report.
    """
    flags = {name: value for name, value in locals().items() if name != "target"}  # every keyword, as given
    models = _models(target)
    if not models:
        log.warning("rocm_sd.optimize: nothing to optimize in %s", type(target).__name__)
    pool = GraphPool()  # the models of one pipeline run one after another: one memory pool
    for name, model in models.items():
        existing = getattr(model, RECORD_ATTR, None)
        if existing is not None:
            _say_already_optimized(name, existing.flags, flags)
            continue
        record = PatchRecord(flags=flags)
        if type(model).__name__ not in KNOWN_MODELS:
            record.counts["skipped: unknown model class " + type(model).__name__] += 1
        elif any(accelerate_hooked(m) for m in model.modules() if m is not model):
            # Sequential CPU offload already installed: accelerate's hooks wrap the modules' own forwards, which
            # the swapped modules would no longer reach (their weights stay on the meta device).
            record.counts[OFFLOAD_FIRST] += 1
            log.warning("rocm_sd.optimize: %s left untouched: %s", name, OFFLOAD_FIRST)
        elif type(model).__name__ in TEXT_ENCODERS:
            if not text_encoder:
                record.counts["skipped: text_encoder=False"] += 1
            else:
                if layer_norm:
                    patch_layer_norms(model, record)
                if cuda_graph:
                    _install_graphs(model, record, pool)
        else:
            if group_norm:
                patch_group_norms(model, record)
                if fuse_resnet:
                    patch_resnets(model, record)
            if layer_norm:
                patch_layer_norms(model, record)
                if fuse_transformer:
                    patch_transformer_blocks(model, record)
            if geglu:
                patch_geglus(model, record)
            if pointwise_gemm:
                patch_pointwise_convs(model, record)
            if fold_upsample:
                patch_upsamplers(model, record)
            if channels_last:
                _to_channels_last(model, record)
            if fuse_qkv:
                _fuse_qkv(model, record)
            if attention:  # after fuse_qkv: the fused processors are replaced too, and restored first
                patch_attention(model, record)
            if cuda_graph:  # last: the graphs capture the patched model
                _install_graphs(model, record, pool)
        setattr(model, RECORD_ATTR, record)
        _load_tuning(model)
    for name, model in _untouched(target).items():
        log.info("rocm_sd.optimize: %s (%s) left untouched", name, type(model).__name__)
    return target


def _say_already_optimized(name: str, applied: dict, asked: dict) -> None:
    changed = {flag: value for flag, value in asked.items() if applied.get(flag) != value}
    if not changed:
        log.info("rocm_sd.optimize: %s is already optimized", name)
        return
    # Patches stack in one order (graphs capture what the others left): a flag cannot be taken out alone.
    log.warning("rocm_sd.optimize: %s is already optimized with %s; %s not applied. Call rocm_sd.revert() on it "
                "first, then optimize() with the new flags", name,
                ", ".join(f"{flag}={applied.get(flag)}" for flag in changed),
                ", ".join(f"{flag}={value}" for flag, value in changed.items()))


def _load_tuning(model) -> None:
    """Reads the model's GPU's tuning database now, before the first convolution: on ROCm that also points
    MIOpen at the tuner's find database, which MIOpen reads only when it starts (tune/vendor.py)."""
    device = next((p.device for p in model.parameters()), None)
    if device is not None and device.type == "cuda":
        from ..tune import active

        active.load(device)


def revert(target):
    """Undo optimize(): the original modules come back, so outputs equal the untouched model's bit for bit."""
    for model in _models(target).values():
        record = getattr(model, RECORD_ATTR, None)
        if record is not None:
            record.revert()
            delattr(model, RECORD_ATTR)
    return target


def report(target) -> dict[str, dict[str, int]]:
    """What optimize() replaced, per component, and how graphed calls ran so far:
    {'unet': {'group_norm+silu': 45, 'group_norm': 16, 'graphed: forward': 1,
              'forward: graph replays': 20, 'forward: graph captures': 1}, ...,
     'safety_checker': {'left untouched: StableDiffusionSafetyChecker': 1}}."""
    out = {}
    for name, model in _models(target).items():
        record = getattr(model, RECORD_ATTR, None)
        counts = dict(record.counts) if record is not None else {}
        for method, call in (record.graphed.items() if record is not None else ()):
            counts.update({f"{method}: {what}": n for what, n in call.stats.items()})
        out[name] = counts
    for name, model in _untouched(target).items():
        out[name] = {f"left untouched: {type(model).__name__}": 1}
    return out


def invalidate_graphs(target):
    """Drop the captured graphs of `target`'s models; the next calls capture again."""
    for model in _models(target).values():
        record = getattr(model, RECORD_ATTR, None)
        for call in (record.graphed.values() if record is not None else ()):
            call.clear()
    return target
