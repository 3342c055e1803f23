"""optimize(pipe) / revert(pipe): apply rocm_sd to a diffusers pipeline, or to one model."""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Callable

from torch import nn

from .. import platform
from ..graphs import GraphPool
from ..modules.fusing import accelerate_hooked
from . import attention_fp8, diffusers, precision, step_cache
from .core import RECORD_ATTR, PatchRecord, eight_bit

log = logging.getLogger("rocm_sd")

# Pipeline attributes that hold models rocm_sd knows how to patch, and the model classes it accepts.
COMPONENTS = ("unet", "transformer", "vae", "controlnet", "text_encoder", "text_encoder_2", "text_encoder_3")
DIFFUSION_MODELS = {"UNet2DConditionModel", "UNet2DModel", "AutoencoderKL", "ControlNetModel",
                    "SD3Transformer2DModel", "FluxTransformer2DModel"}
# transformers' CLIP encoders (SD1.x/2.x, both of SDXL's and SD3's) and T5's encoder (SD3, Flux): their norms and a
# graphed forward. Encoding a prompt is a few hundred small launches, host-bound like a UNet step, once per prompt.
TEXT_ENCODERS = {"CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel"}
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


OFFLOAD_FIRST = ("skipped: accelerate hooks on its modules (sequential CPU offload); call rocm_sd.optimize() "
                 "before enable_sequential_cpu_offload()")


def _untouched(target) -> dict[str, nn.Module]:
    """A pipeline's models that optimize() does not patch (safety checker, image encoder, ...)."""
    components = getattr(target, "components", None)
    if isinstance(target, nn.Module) or not isinstance(components, dict):
        return {}
    return {name: model for name, model in components.items()
            if isinstance(model, nn.Module) and name not in COMPONENTS}


@dataclass(frozen=True)
class Flag:
    """One optimize() keyword: what it turns on (its patcher, patch/diffusers.py), whether it is on by default (and,
    where that differs, with an 8-bit `precision` or with ROCm's torch), the flag it needs on too, and whether it also
    applies to the CLIP text encoders."""
    name: str
    patch: Callable[[nn.Module, PatchRecord], None] | None
    doc: str
    default: bool = True
    needs: str | None = None
    text_encoders: bool = False
    default_8bit: bool | None = None
    default_rocm: bool | None = None

    @property
    def default_varies(self) -> bool:
        """Whether the default depends on the precision or the platform (the flag then also takes None)."""
        return self.default_8bit is not None or self.default_rocm is not None

    def default_for(self, options: dict) -> bool:
        """The flag's default given optimize()'s options, on this platform."""
        if eight_bit(options) and self.default_8bit is not None:
            return self.default_8bit
        if self.default_rocm is not None and platform.torch_gpu_platform() == "hip":
            return self.default_rocm
        return self.default

    def value(self, keywords: dict, options: dict) -> bool:
        """The flag as applied: the caller's value, else its default (None asks for the default too where the
        precision decides it, as the signature says). Anything but True / False (and that None) is a ValueError:
        bool() would read "no", "off" or 0.5 as on."""
        given = keywords.get(self.name)
        if self.name not in keywords or (given is None and self.default_varies):
            return self.default_for(options)
        if not isinstance(given, bool):
            accepted = "True, False or None" if self.default_varies else "True or False"
            raise ValueError(f"optimize(): {self.name}={given!r} is not one of {accepted}")
        return given

    def default_text(self) -> str:
        text = "on" if self.default else "off"
        if self.default_8bit is not None and self.default_8bit != self.default:
            text += f" ({'on' if self.default_8bit else 'off'} with precision fp8 / int8)"
        if self.default_rocm is not None and self.default_rocm != self.default:
            text += f" ({'on' if self.default_rocm else 'off'} with ROCm's torch)"
        return text


# In the order they are applied: later patches rely on earlier ones (the attention patch replaces fused-QKV
# processors; the graphs capture what all the others left; text_kv stands around the graphed step).
FLAGS = (
    Flag("group_norm", diffusers.patch_group_norms,
         "GroupNorm (+ the SiLU that follows it) -> rocm_sd::group_norm. Statistics in fp32: fp16 results differ "
         "from PyTorch's by rounding only."),
    Flag("fuse_resnet", diffusers.patch_resnets,
         "ResnetBlock2D's conv biases, time embedding, residual add and scale folded into its GroupNorm (input bias) "
         "and one rocm_sd::bias_residual (modules/resnet.py). In builds with Composable Kernel instances (ROCm), conv2 "
         "and its tail go through rocm_sd::conv_bias_residual, where the tuner may pick a CK convolution with bias and "
         "residual in its epilogue. Additions in another order: rounding-level differences.", needs="group_norm"),
    Flag("layer_norm", diffusers.patch_layer_norms,
         "nn.LayerNorm over the last dimension (the transformer blocks' norms) -> rocm_sd::layer_norm; T5's RMSNorm "
         "(SD3, Flux) -> rocm_sd::rms_norm.",
         text_encoders=True),
    Flag("fuse_transformer", diffusers.patch_transformer_blocks,
         "BasicTransformerBlock's residual adds after self- and cross-attention folded into the LayerNorm that follows "
         "each (rocm_sd::add_layer_norm, modules/transformer.py). Same math and rounding. In the diffusion "
         "transformers (SD3 / SD3.5, Flux), each block's AdaLN-Zero chain: the modulated norms as "
         "rocm_sd::ada_layer_norm, each gated residual with the norm after it as rocm_sd::add_ada_layer_norm, Flux's "
         "single blocks without their concatenations (modules/mmdit.py). Rounding-level differences (the gated "
         "residuals round once).", needs="layer_norm"),
    Flag("geglu", diffusers.patch_geglus,
         "The feed-forward's GEGLU epilogue (chunk, gelu, multiply) -> rocm_sd::geglu, one kernel. In builds with CK "
         "instances (ROCm), projection and epilogue go through rocm_sd::linear_geglu, where the tuner may pick CK "
         "GEMMs with the epilogue fused."),
    Flag("linear_gelu", diffusers.patch_gelus,
         "The diffusion transformers' feed-forward projection and GELU(tanh) as one GEMM with the bias and GELU in the "
         "vendor's epilogue (cuBLASLt / hipBLASLt, through torch._addmm_activation; modules/mmdit.py). "
         "Rounding-level differences."),
    Flag("pointwise_gemm", diffusers.patch_pointwise_convs,
         "1x1 convolutions (SD1.x's proj_in/proj_out, resnet shortcuts) on channels_last activations as one GEMM with "
         "the bias fused (modules/pointwise.py). Different summation order: rounding-level differences."),
    Flag("fold_upsample", diffusers.patch_upsamplers,
         "Upsample2D's nearest 2x upsampling and the 3x3 convolution after it as one 2x2 convolution at the input "
         "resolution plus rocm_sd::parity_shuffle: 2.25x fewer multiply-adds, no 4x intermediate "
         "(modules/upsample.py). Rounding-level differences (the folded kernels are sums of the 3x3 taps)."),
    Flag("channels_last", diffusers.to_channels_last,
         "Convolution weights (and so activations) in NHWC: cuDNN / MIOpen run NHWC convolutions without converting, "
         "rocm_sd's GroupNorm keeps the layout, and the transformer blocks hand back channels_last without a copy. "
         "Keep group_norm on with it: PyTorch's own channels_last GroupNorm is slow (docs/performance.md)."),
    Flag("fuse_qkv", diffusers.fuse_qkv,
         "One projection for Q, K and V of self-attention, one for K and V of cross-attention (diffusers' "
         "fuse_qkv_projections): one GEMM where there were three. Off by default in fp16: it adds `to_qkv` weights "
         "(state-dict keys, GPU memory) while optimized. On with an 8-bit precision asked, for every model optimize() "
         "patches (the VAE's attention too, fused in its own dtype), even where the precision itself cannot apply: "
         "the separate projections then wait in CPU memory (patch/diffusers.py), so the GPU holds only the fused "
         "weights (8-bit in the UNet).", default=False, default_8bit=True),
    Flag("attention", diffusers.patch_attention,
         "diffusers' AttnProcessor2_0 (and its fused-QKV variant) -> RocmAttnProcessor: the same steps, the attention "
         "through rocm_sd::attention on [B, L, H, D] views (no transpose copies). Per shape it runs rocm_sd's kernel "
         "where `python -m rocm_sd.tune` measured it faster, and untuned where SDPA has no fused kernel for the call "
         "(after a self-check on the GPU), else PyTorch's SDPA. SD3's JointAttnProcessor2_0 and "
         "Flux's FluxAttnProcessor -> RocmJointAttnProcessor / RocmFluxAttnProcessor (modules/joint_attention.py): "
         "the RMSNorm of Q and K, the joining of the text and image rows and Flux's rotary embedding as one "
         "rocm_sd::rms_norm each for Q and K, then the same attention."),
    Flag("vae_tiles", diffusers.tile_vae_decode,
         "AutoencoderKL's decode, for latents of 64 or more on both sides (images of 512 pixels or more a side for "
         "SD's VAEs), one image at a time in tiles of 64, 96 or 128 latents a side, overlapping and blended "
         "(modules/vae_tiles.py): every image size "
         "then runs the same nine tile shapes' convolutions, so MIOpen's first-run search (find), which takes minutes "
         "at each new size, runs once per tile shape (`python -m rocm_sd prepare` runs it ahead). Tiles differ from "
         "the untiled decode as diffusers' own tiled decode does (their GroupNorms see a tile's statistics).",
         default=False, default_rocm=True),
    Flag("text_encoder", None,
         "The text encoders (CLIP, and T5 for SD3 / Flux) too: their norms (with layer_norm) and a graphed forward "
         "(with cuda_graph). Their attention stays transformers' own."),
    Flag("cuda_graph", diffusers.install_graphs,
         "The UNet / ControlNet step, the VAE decode and the text encoders replay a captured CUDA/HIP graph per input "
         "shape (rocm_sd/graphs.py). Calls that cannot be graphed (autograd on, CPU tensors, torch.compile "
         "tracing...) run eagerly; report() says how often and why. After changing a model in ways rocm_sd cannot "
         "see (e.g. a LoRA scale), call invalidate_graphs(target).", text_encoders=True),
    Flag("text_kv", diffusers.reuse_text_kv,
         "Cross-attention's keys and values of the text computed once per prompt, not at every step: while a call's "
         "encoder_hidden_states is the tensor an earlier call had, unchanged, and the projections' weights are "
         "unchanged, the processors read the keys and values kept from then (modules/text_kv.py). Same numbers. Around "
         "the graphed step, with a graph of its own.", needs="attention"),
)
FLAG_NAMES = tuple(flag.name for flag in FLAGS)


@dataclass(frozen=True)
class Option:
    """One optimize() keyword that takes a value (a number format, a step-cache mode) rather than on/off. It applies
    to the diffusion models named in `models` only, after the flags' patchers and before `cuda_graph`, so the graphs
    capture it. `patch(model, record, options)` gets every option's value; None for options that only parameterize
    another (cache_interval)."""
    name: str
    default: object
    doc: str
    values: tuple = ()                          # the allowed values; empty: any number of `number` type
    number: type | None = None
    minimum: float | None = None
    patch: Callable[[nn.Module, PatchRecord, dict], None] | None = None
    models: frozenset = frozenset({"UNet2DConditionModel"})
    optional: bool = False                      # a `number` option that also takes None (its default then depends)

    def check(self, value):
        """The value as applied, or a ValueError naming the option, the value and what it accepts."""
        if value is None and self.optional:
            return None
        if self.values:
            if value not in self.values:
                raise ValueError(f"optimize(): {self.name}={value!r} is not one of "
                                 f"{', '.join(repr(v) for v in self.values)}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                self.number is int and not float(value).is_integer()):
            raise ValueError(f"optimize(): {self.name}={value!r} is not "
                             f"{'an integer' if self.number is int else 'a number'}")
        if self.minimum is not None and not value >= self.minimum:
            raise ValueError(f"optimize(): {self.name}={value!r} is below its minimum {self.minimum}")
        return self.number(value)


OPTIONS = (
    Option("precision", "fp16",
           "Number format of the UNet's linear layers (attention projections, feed-forward, proj_in/out, 1x1 "
           "convolutions) and of the diffusion transformers' (SD3 / SD3.5, Flux: their blocks' attention projections, "
           "feed-forward and single-block projections; not the AdaLN modulation or the embedders). 'fp16': the "
           "model's own dtype. 'fp8': FP8 GEMMs (e4m3fnuz on gfx942, OCP e4m3fn on gfx950, "
           "gfx12 and NVIDIA sm_89+), weights quantized once per output channel, activations per row. 'int8': int8 "
           "GEMMs, the same scaling. Where the device or build cannot, the layers stay in the model's dtype and the "
           "log says why once. Changes images: check with `python -m rocm_sd quality` (docs/quality.md).",
           values=("fp16", "fp8", "int8"), patch=precision.quantize_linears,
           models=frozenset({"UNet2DConditionModel", "SD3Transformer2DModel", "FluxTransformer2DModel"})),
    Option("precision_layers", "measured",
           "With precision 'fp8' / 'int8': 'measured': a layer goes back to the model's dtype at its first call where "
           "the tuning database measured its fp16 GEMM faster than the 8-bit GEMM plus its share of quantizing the "
           "input (shipped for NVIDIA Hopper; `python -m rocm_sd.tune --precision fp8` measures your GPU; untuned "
           "layers stay 8-bit). 'all': every layer 8-bit (the least memory).",
           values=("measured", "all")),
    Option("precision_scales", "tensor",
           "With precision 'fp8': 'tensor': the layers whose input a LayerNorm or the feed-forward's GEGLU writes "
           "take one scale for that input, from a bound on its values derived from the weights (nothing to calibrate, "
           "nothing saturates), and one for their weight: the per-tensor FP8 GEMM, faster than the row-wise one on "
           "narrow layers. 'row': a scale per row and per output channel everywhere. int8 is always row-wise, and so are "
           "the diffusion transformers (their AdaLN's output has no bound: its scale and shift change per call).",
           values=("tensor", "row")),
    Option("precision_convs", True,
           "With precision 'fp8': the resnets' convolutions whose input a GroupNorm writes (both 3x3 convolutions of "
           "each block) as FP8 GEMMs over their quantized patches, with one scale from the GroupNorm's bound "
           "(rocm_sd::im2col_quantize, torch._scaled_mm); where the tuning database measured the fp16 convolution "
           "faster, it stays (with precision_layers 'measured'). False: convolutions stay in the model's dtype.",
           values=(True, False)),
    Option("attention_precision", "fp16",
           "Number format of the UNet's attention products (needs `attention`). 'fp8': Q and K quantized per token, V "
           "per channel, the probabilities as FP8, softmax and sums in fp32 (rocm_sd::attention_fp8), at each shape "
           "where the tuning database measured it faster than the fp16 attention (`python -m rocm_sd.tune --ops "
           "attention_fp8`), fp16 elsewhere and on GPUs without FP8. Changes images: check with `python -m rocm_sd "
           "quality`.",
           values=("fp16", "fp8"), patch=attention_fp8.attention_in_fp8),
    Option("cache", None,
           "Step caching: None (off). For UNets: 'deepcache': every `cache_interval`-th UNet call runs in full and the "
           "calls between reuse its deep features, running only the outermost blocks; 'adaptive': a full call whenever "
           "the UNet's input has changed by `cache_threshold` (relative L1, summed since the last full call). For the "
           "diffusion transformers (SD3 / SD3.5, Flux): 'fbcache' (First Block Cache): every call runs the first "
           "block, and the rest of the network only when that block's residual has changed by `cache_threshold` since "
           "the last full call, else adds the rest's residual kept from then; 'teacache': the same skip, decided by "
           "the first block's modulated input changing (rescaled relative L1, summed) before any block runs. A mode "
           "of the other kind of model is not applied (report() says why). Changes images: check with `python -m "
           "rocm_sd quality`.",
           values=(None, "deepcache", "adaptive", "fbcache", "teacache"), patch=step_cache.cache_steps,
           models=frozenset({"UNet2DConditionModel", "SD3Transformer2DModel", "FluxTransformer2DModel"})),
    Option("cache_interval", 3, "With cache='deepcache': one full UNet call per this many steps.",
           number=int, minimum=1),
    Option("cache_threshold", None,
           "With cache='adaptive', 'fbcache' or 'teacache': the change that triggers a full call. None: the mode's "
           "default: 0.15 for 'adaptive'; as published, 'fbcache' 0.08 on Flux (diffusers' ParaAttention guide) and "
           "0.12 on SD3 / SD3.5 (Comfy-WaveSpeed's, for SD3.5 Large), 'teacache' 0.4 on Flux (ComfyUI-TeaCache's) "
           "and 0.3 on SD3 / SD3.5 (PaddleMIX's SD3 port; none is recommended for SD3). 0: every call full.",
           number=float, minimum=0.0, optional=True),
    Option("cache_branch", 0,
           "With a step cache: how much of the outermost block a partial call runs (DeepCache's cache_branch_id). 0: "
           "only the last layer of the last up block (DeepCache's default, the fastest); 1: also the first layer of "
           "the first down block and the up layer mirroring it; 2: the whole outermost block, both ways (SD1.x/2.x/"
           "SDXL have two layers per block). Higher: slower partial calls, closer to the full ones.",
           number=int, minimum=0),
)
OPTION_NAMES = tuple(option.name for option in OPTIONS)


def flags_table() -> str:
    """FLAGS and OPTIONS as the markdown tables of docs/usage.md (docs/flags_table.py writes them there; a test keeps
    them current)."""
    rows = ["| flag | default | what it does |", "|---|---|---|"]
    for flag in FLAGS:
        needs = f" Needs `{flag.needs}`." if flag.needs else ""
        rows.append(f"| `{flag.name}` | {flag.default_text()} | {flag.doc}{needs} |")
    rows += ["", "| option | default | values | what it does |", "|---|---|---|---|"]
    for option in OPTIONS:
        values = (", ".join(f"`{v!r}`" for v in option.values) if option.values
                  else f"{option.number.__name__} >= {option.minimum}" + (" or `None`" if option.optional else ""))
        rows.append(f"| `{option.name}` | `{option.default!r}` | {values} | {option.doc} |")
    return "\n".join(rows)


def _flags_doc() -> str:
    flags = [f"      {flag.name}{'' if flag.default_text() == 'on' else ' (' + flag.default_text() + ' by default)'}: "
             f"{flag.doc}" for flag in FLAGS]
    options = [f"      {option.name}={option.default!r}: {option.doc}" for option in OPTIONS]
    return "\n".join(flags + ["", "    Options (the diffusion models they name; applied after the flags, before "
                                   "cuda_graph):"] + options)


def optimize(target, **keywords):
    """Make a diffusers pipeline (or one of its models) use rocm_sd kernels; returns `target`.

    Keyword flags, one per optimization, each True / False (FLAGS, in the order applied; a flag whose default
    depends on the precision also takes None, that default):
{flags}

    Ops fall back to PyTorch per call where a kernel cannot run (CPU tensors, unsupported dtype...);
    `rocm_sd.stats()` counts which backend ran. `report(target)` says what was replaced.
    Unknown components (a safety checker, an image encoder, a model class rocm_sd does not know) are
    left untouched and listed as such in the report.
    """
    unknown = sorted(set(keywords) - set(FLAG_NAMES) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"optimize() got unknown keywords {', '.join(unknown)}; the flags are {', '.join(FLAG_NAMES)} "
                        f"and the options {', '.join(OPTION_NAMES)}")
    options = {option.name: option.check(keywords.get(option.name, option.default)) for option in OPTIONS}
    flags = {flag.name: flag.value(keywords, options) for flag in FLAGS}  # every flag, as applied
    models = _models(target)
    if not models:
        log.warning("rocm_sd.optimize: nothing to optimize in %s", type(target).__name__)
    pool = GraphPool()  # the models of one pipeline run one after another: one memory pool
    for name, model in models.items():
        existing = getattr(model, RECORD_ATTR, None)
        if existing is not None:
            _say_already_optimized(name, existing.flags, {**flags, **options})
            continue
        record = PatchRecord(flags={**flags, **options}, graph_pool=pool)
        text_encoder = type(model).__name__ in TEXT_ENCODERS
        if type(model).__name__ not in KNOWN_MODELS:
            record.counts["skipped: unknown model class " + type(model).__name__] += 1
        elif any(accelerate_hooked(m) for m in model.modules() if m is not model):
            # Sequential CPU offload already installed: accelerate's hooks wrap the modules' own forwards, which
            # the swapped modules would no longer reach (their weights stay on the meta device).
            record.counts[OFFLOAD_FIRST] += 1
            log.warning("rocm_sd.optimize: %s left untouched: %s", name, OFFLOAD_FIRST)
        elif text_encoder and not flags["text_encoder"]:
            record.counts["skipped: text_encoder=False"] += 1
        else:
            for flag in FLAGS:
                if flag.name == "cuda_graph":
                    for option in OPTIONS:
                        if option.patch is not None and type(model).__name__ in option.models:
                            option.patch(model, record, options)
                if (flag.patch is not None and flags[flag.name] and (flag.needs is None or flags[flag.needs])
                        and (flag.text_encoders or not text_encoder)):
                    flag.patch(model, record)
        setattr(model, RECORD_ATTR, record)
        _load_tuning(model)
    for name, model in _untouched(target).items():
        log.info("rocm_sd.optimize: %s (%s) left untouched", name, type(model).__name__)
    return target


optimize.__doc__ = optimize.__doc__.format(flags=_flags_doc())
optimize.__signature__ = inspect.Signature(
    [inspect.Parameter("target", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + [inspect.Parameter(flag.name, inspect.Parameter.KEYWORD_ONLY,
                         default=None if flag.default_varies else flag.default,  # None: precision / platform decide
                         annotation=bool | None if flag.default_varies else bool) for flag in FLAGS]
    + [inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                         annotation=option.number or object) for option in OPTIONS])


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


def skipped_options(target, options: dict) -> list[str]:
    """Why `options` (optimize()'s, as given to it) left `target` as the default optimize() would: one
    '<component>: <why>' per model whose patcher skipped one, or per option no model of `target` takes; [] when all
    took effect."""
    models = _models(target)
    reasons = []
    for option in OPTIONS:
        if option.patch is None or options.get(option.name, option.default) == option.default:
            continue
        takers = {name: m for name, m in models.items() if type(m).__name__ in option.models}
        if not takers:
            reasons.append(f"{option.name}: no {' / '.join(sorted(option.models))} in {type(target).__name__}")
        for name, model in takers.items():
            record = getattr(model, RECORD_ATTR, None)
            why = record.skipped_options.get(option.name) if record is not None else "not optimized"
            if why:
                reasons.append(f"{name}: {why}")
    return reasons


def invalidate_graphs(target):
    """Drop the captured graphs of `target`'s models, the text keys and values kept (text_kv) and the step cache's
    cached features (the next call is a full one); the next calls capture and compute again."""
    for model in _models(target).values():
        record = getattr(model, RECORD_ATTR, None)
        if record is not None:
            record.invalidate()
    return target
