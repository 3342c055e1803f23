"""optimize()'s keywords as data: the on/off flags (FLAGS, in the order applied) and the options that take a
value (OPTIONS), with their defaults, docs and allowed values.

Light on purpose: the commands' --help and argument checks read these tables without importing torch. So each
entry names its patcher ('diffusers.patch_group_norms': rocm_sd/patch/diffusers.py's function), and patcher()
imports it when optimize() applies it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


def patcher(name: str) -> Callable:
    """The function a table entry names: 'diffusers.patch_group_norms' is rocm_sd/patch/diffusers.py's."""
    module, function = name.rsplit(".", 1)
    return getattr(importlib.import_module(f".{module}", __package__), function)


def eight_bit(options: dict) -> bool:
    """Whether optimize()'s options (or a PatchRecord's flags, which hold them) ask for an 8-bit precision."""
    return options.get("precision", "fp16") != "fp16"


@dataclass(frozen=True)
class Flag:
    """One optimize() keyword: what it turns on (its patcher, patch/diffusers.py), whether it is on by default (and,
    where that differs, with an 8-bit `precision` or with ROCm's torch), the flag it needs on too, and whether it also
    applies to the CLIP text encoders."""
    name: str
    patch: str | None                   # its patcher, patcher(patch)(model, record)
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
        from .. import platform  # imports torch: optimize() asks, never a command's argument check

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
    Flag("group_norm", "diffusers.patch_group_norms",
         "GroupNorm (+ the SiLU that follows it) -> rocm_sd::group_norm. Statistics in fp32: fp16 results differ "
         "from PyTorch's by rounding only."),
    Flag("fuse_resnet", "diffusers.patch_resnets",
         "ResnetBlock2D's conv biases, time embedding, residual add and scale folded into its GroupNorm (input bias) "
         "and one rocm_sd::bias_residual (modules/resnet.py). In builds with Composable Kernel instances (ROCm), conv2 "
         "and its tail go through rocm_sd::conv_bias_residual, where the tuner may pick a CK convolution with bias and "
         "residual in its epilogue. Additions in another order: rounding-level differences.", needs="group_norm"),
    Flag("layer_norm", "diffusers.patch_layer_norms",
         "nn.LayerNorm over the last dimension (the transformer blocks' norms) -> rocm_sd::layer_norm; T5's RMSNorm "
         "(SD3, Flux) -> rocm_sd::rms_norm.",
         text_encoders=True),
    Flag("fuse_transformer", "diffusers.patch_transformer_blocks",
         "BasicTransformerBlock's residual adds after self- and cross-attention folded into the LayerNorm that follows "
         "each (rocm_sd::add_layer_norm, modules/transformer.py). Same math and rounding. In the diffusion "
         "transformers (SD3 / SD3.5, Flux), each block's AdaLN-Zero chain: the modulated norms as "
         "rocm_sd::ada_layer_norm, each gated residual with the norm after it as rocm_sd::add_ada_layer_norm, Flux's "
         "single blocks without their concatenations (modules/mmdit.py). Rounding-level differences (the gated "
         "residuals round once).", needs="layer_norm"),
    Flag("geglu", "diffusers.patch_geglus",
         "The feed-forward's GEGLU epilogue (chunk, gelu, multiply) -> rocm_sd::geglu, one kernel. In builds with CK "
         "instances (ROCm), projection and epilogue go through rocm_sd::linear_geglu, where the tuner may pick CK "
         "GEMMs with the epilogue fused."),
    Flag("linear_gelu", "diffusers.patch_gelus",
         "The diffusion transformers' feed-forward projection and GELU(tanh) with one pass over its output: the bias "
         "and GELU in the vendor GEMM's epilogue where PyTorch runs them there (cuBLASLt on NVIDIA, hipBLASLt on CDNA: "
         "torch._addmm_activation), else the GEMM without the bias and rocm_sd::gelu_tanh adding it (RDNA, where "
         "PyTorch's addmm has no such epilogue; modules/mmdit.py). Rounding-level differences."),
    Flag("pointwise_gemm", "diffusers.patch_pointwise_convs",
         "1x1 convolutions (SD1.x's proj_in/proj_out, resnet shortcuts) on channels_last activations as one GEMM with "
         "the bias fused (modules/pointwise.py). Different summation order: rounding-level differences."),
    Flag("fold_upsample", "diffusers.patch_upsamplers",
         "Upsample2D's nearest 2x upsampling and the 3x3 convolution after it as one 2x2 convolution at the input "
         "resolution plus rocm_sd::parity_shuffle: 2.25x fewer multiply-adds, no 4x intermediate "
         "(modules/upsample.py). Rounding-level differences (the folded kernels are sums of the 3x3 taps)."),
    Flag("channels_last", "diffusers.to_channels_last",
         "Convolution weights (and so activations) in NHWC: cuDNN / MIOpen run NHWC convolutions without converting, "
         "rocm_sd's GroupNorm keeps the layout, and the transformer blocks hand back channels_last without a copy. "
         "Keep group_norm on with it: PyTorch's own channels_last GroupNorm is slow (docs/performance.md)."),
    Flag("fuse_qkv", "diffusers.fuse_qkv",
         "One projection for Q, K and V of self-attention, one for K and V of cross-attention (diffusers' "
         "fuse_qkv_projections): one GEMM where there were three. Off by default in fp16: it adds `to_qkv` weights "
         "(state-dict keys, GPU memory) while optimized. On with an 8-bit precision asked, for every model optimize() "
         "patches (the VAE's attention too, fused in its own dtype), even where the precision itself cannot apply: "
         "the separate projections then wait in CPU memory (patch/diffusers.py), so the GPU holds only the fused "
         "weights (8-bit in the UNet).", default=False, default_8bit=True),
    Flag("attention", "diffusers.patch_attention",
         "diffusers' AttnProcessor2_0 (and its fused-QKV variant) -> RocmAttnProcessor: the same steps, the attention "
         "through rocm_sd::attention on [B, L, H, D] views (no transpose copies). Per shape it runs rocm_sd's kernel "
         "where `python -m rocm_sd.tune` measured it faster, and untuned where SDPA has no fused kernel for the call "
         "(after a self-check on the GPU), else PyTorch's SDPA. SD3's JointAttnProcessor2_0 and "
         "Flux's FluxAttnProcessor -> RocmJointAttnProcessor / RocmFluxAttnProcessor (modules/joint_attention.py): "
         "the RMSNorm of Q and K, the joining of the text and image rows and Flux's rotary embedding as one "
         "rocm_sd::rms_norm each for Q and K, then the same attention."),
    Flag("vae_tiles", "diffusers.tile_vae_decode",
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
    Flag("cuda_graph", "diffusers.install_graphs",
         "The UNet / ControlNet step, the VAE decode and the text encoders replay a captured CUDA/HIP graph per input "
         "shape (rocm_sd/graphs.py). Calls that cannot be graphed (autograd on, CPU tensors, torch.compile "
         "tracing...) run eagerly; report() says how often and why. After changing a model in ways rocm_sd cannot "
         "see (e.g. a LoRA scale), call invalidate_graphs(target).", text_encoders=True),
    Flag("text_kv", "diffusers.reuse_text_kv",
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
    patch: str | None = None                    # its patcher, patcher(patch)(model, record, options)
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
           values=("fp16", "fp8", "int8"), patch="precision.quantize_linears",
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
           values=("fp16", "fp8"), patch="attention_fp8.attention_in_fp8"),
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
           values=(None, "deepcache", "adaptive", "fbcache", "teacache"), patch="step_cache.cache_steps",
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


def option(name: str) -> Option:
    """OPTIONS' entry `name` (a command offers its values as choices)."""
    return next(entry for entry in OPTIONS if entry.name == name)


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
