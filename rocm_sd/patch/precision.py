"""optimize(precision="fp8" | "int8"): the UNet's linear layers (attention projections, feed-forward, proj_in /
proj_out, 1x1 convolutions) as 8-bit GEMMs (modules/quantized_linear.py).

The layers whose rows are few (the time and class embeddings, the resnets' time projections: one row per image)
stay as they are: an 8-bit GEMM of two rows saves nothing. The replaced layers' fp16 weights wait in CPU memory until
revert(), which puts them back: GPU memory holds the 8-bit weights only. With precision_layers="measured" (the
default) a layer goes back to fp16 at its first call where the tuning database measured that faster for its shape
(modules/quantized_linear.RocmQuantizedLinear.offer_fp16).

With precision_scales="tensor" (the default; fp8 only) the layers whose input a LayerNorm or the feed-forward's GEGLU
writes take one scale for that input and one for their weight: the per-tensor FP8 GEMM. The scale comes from a bound
no value of the producer's output can exceed, derived from the weights (layer_norm_bound, geglu_bound), never from
the data: nothing to calibrate, and nothing saturates. A bound above the values costs nothing: e4m3 keeps its three
mantissa bits over 2^15 of range below its largest value, and the bounds here sit one to two orders of magnitude
above typical activations.
"""
from __future__ import annotations

import logging
import math

import torch
from torch import nn

from .. import platform
from ..modules.geglu import RocmGEGLU, feed_forward_8bit, feeds_8bit_directly
from ..modules.layer_norm import RocmLayerNorm
from ..modules.quantized_conv import GroupNormBound, RocmQuantizedConv2d, quantizable_conv
from ..modules.pointwise import RocmPointwiseConv2d, is_pointwise
from ..modules.quantized_linear import BOUND_MARGIN, FEW_ROWS, RocmQuantizedLinear, new_model_call
from ..modules.resnet import plain_time_embedding
from ..ops.quantize import dequantize_rows, fp8_format
from .core import PatchRecord
from .diffusers import fused_away, park_in_cpu_memory
from .precision_dit import is_diffusion_transformer, quantize_transformer

log = logging.getLogger("rocm_sd")

# The GEMMs' shape rules: torch._scaled_mm wants K and N multiples of 16, torch._int_mm multiples of 8.
MULTIPLE = {"fp8": 16, "int8": 8}


def number_format(device: torch.device, precision: str) -> tuple[str | None, str | None]:
    """The 8-bit format `precision` means on `device`, or (None, why it cannot run there)."""
    if device.type != "cuda":
        return None, f"the model is on {device.type}; 8-bit GEMMs need a GPU"
    arch = platform.device_arch(device)
    if precision == "int8":
        return "int8", _probe(device, "int8", arch)
    fmt, why = fp8_format(arch)
    return (fmt, _probe(device, fmt, arch)) if fmt else (None, why)


_probed: dict[tuple, str | None] = {}


def _probe(device: torch.device, fmt: str, arch: str) -> str | None:
    """Runs one small GEMM of the format on the device and checks it against fp32: None if right, else why not
    (a torch build without the GEMM, a BLAS library that rejects row-wise scales...)."""
    key = (str(device), fmt)
    if key not in _probed:
        gen = torch.Generator(device="cpu").manual_seed(0)
        weight, x = torch.randn(64, 64, generator=gen), torch.randn(32, 64, generator=gen)
        try:
            layer = RocmQuantizedLinear(weight.to(device, torch.float16), None, fmt)
            out = layer(x.to(device, torch.float16)).float().cpu()
            error = (out - x @ weight.t()).abs().max().item() / (x @ weight.t()).abs().max().item()
            _probed[key] = None if error < 0.1 else f"the {fmt} GEMM's result is off by {error:.0%} on {arch}"
        except (RuntimeError, TypeError, NotImplementedError) as err:
            _probed[key] = f"torch {torch.__version__} cannot run the {fmt} GEMM on {arch}: {err}".split("\n")[0]
    return _probed[key]


def _eligible(name: str, module: nn.Module, multiple: int) -> bool:
    if any(part in FEW_ROWS for part in name.split(".")):
        return False
    if type(module) is nn.Linear:
        n, k = module.out_features, module.in_features
    elif type(module) is RocmPointwiseConv2d or is_pointwise(module):
        n, k = module.out_channels, module.in_channels
    else:
        return False
    return n % multiple == 0 and k % multiple == 0 and module.weight.dtype in (torch.float16, torch.bfloat16,
                                                                                 torch.float32)


def quantize_linears(model: nn.Module, record: PatchRecord, options: dict) -> None:
    precision = options["precision"]
    if precision == "fp16":
        return
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    fmt, why = number_format(device, precision)
    if why:
        record.skip_option("precision", f"precision={precision} not applied: {why}")
        log.warning("rocm_sd.optimize: precision=%s not applied to %s, its layers keep their dtype: %s", precision,
                    type(model).__name__, why)
        return
    unused = _fused_away(model, record)
    if is_diffusion_transformer(model):
        quantize_transformer(model, record, fmt, device, MULTIPLE[precision], unused,
                             measured=options["precision_layers"] == "measured")
        return
    targets = [(name, module) for name, module in model.named_modules()
               if module not in unused and _eligible(name, module, MULTIPLE[precision])]
    parents = dict(model.named_modules())
    originals = {}
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        quantized = RocmQuantizedLinear.from_module(module, fmt).to(device)
        record.replace_child(parents[parent_name], child, quantized)
        park_in_cpu_memory(module, record)  # the fp16 weights come back to the GPU with the module at revert()
        originals[quantized] = module
        record.counts[f"{'conv1x1' if quantized.conv else 'linear'} -> {fmt} GEMM"] += 1
    if fmt != "int8" and options["precision_convs"]:
        quantize_convolutions(model, record, fmt, device, measured=options["precision_layers"] == "measured")
    if targets:
        record.add_hook(model.register_forward_pre_hook(new_model_call))
        per_tensor = options["precision_scales"] == "tensor" and fmt != "int8"
        producers = quantize_in_producers(model, record, fmt, originals if per_tensor else None)
        if options["precision_layers"] == "measured":
            for layer, original in originals.items():
                layer.offer_fp16(original, producers.get(layer, []), record.counts)


def _fused_away(model: nn.Module, record: PatchRecord) -> set[nn.Module]:
    """The projections a fused one replaced (fuse_qkv, patch/diffusers.fused_away), which no call reaches while fused:
    not quantized, and kept in CPU memory until revert() (fuse_qkv already moved them there as it fused)."""
    unused = {module for attn in model.modules() for module in fused_away(attn)}
    for module in unused:
        park_in_cpu_memory(module, record)
    return unused


def _bounded_convolutions(block: nn.Module) -> list[tuple[str, nn.GroupNorm]]:
    """(convolution name, the GroupNorm whose output, after SiLU, is all it takes) in a diffusers ResnetBlock2D: conv1
    after norm1 unless the block resamples in between; conv2 after norm2 where nothing but the time embedding's bias
    comes before the norm ("scale_shift" scales the norm's output: no bound)."""
    if not all(hasattr(block, name) for name in ("norm1", "conv1", "norm2", "conv2", "time_embedding_norm")):
        return []
    pairs = []
    if getattr(block, "upsample", None) is None and getattr(block, "downsample", None) is None:
        pairs.append(("conv1", block.norm1))
    if plain_time_embedding(block):
        pairs.append(("conv2", block.norm2))
    return [(name, norm) for name, norm in pairs
            if isinstance(norm, nn.GroupNorm) and quantizable_conv(getattr(block, name))]


def quantize_convolutions(model: nn.Module, record: PatchRecord, fmt: str, device: torch.device,
                          measured: bool) -> None:
    """The resnets' convolutions whose input a GroupNorm (+SiLU) writes, as FP8 GEMMs over their patches
    (modules/quantized_conv.py); the originals wait in CPU memory, and with `measured` (precision_layers) each goes
    back to its original at its first call where the tuning database measured fp16 faster."""
    for block in list(model.modules()):
        for name, norm in _bounded_convolutions(block):
            conv = getattr(block, name)
            if conv.in_channels % MULTIPLE["fp8"] or conv.out_channels % MULTIPLE["fp8"]:
                continue  # the GEMM's shape rule
            quantized = RocmQuantizedConv2d(conv, fmt, group_norm_bound(norm)).to(device)
            record.replace_child(block, name, quantized)
            park_in_cpu_memory(conv, record)
            record.counts[f"conv{conv.kernel_size[0]}x{conv.kernel_size[1]} -> {fmt} GEMM"] += 1
            if measured:
                quantized.offer_fp16(conv, record.counts)


def _consumers(block: nn.Module) -> list[tuple[nn.Module, list[nn.Module]]]:
    """(producer, the layers that take its output) in a diffusers BasicTransformerBlock: norm1 feeds self-attention's
    projections, norm2 cross-attention's query, norm3 the feed-forward's GEGLU, whose output feeds ff.net[2]. (The
    text embedding, cross-attention's keys and values in every block, has no producer here: _text_consumers.)"""
    attn1, attn2, ff = block.attn1, getattr(block, "attn2", None), block.ff
    if getattr(attn1, "fused_projections", False):
        self_attention = [attn1.to_qkv] if not block.only_cross_attention else [attn1.to_q]
    else:
        self_attention = [attn1.to_q] + ([] if block.only_cross_attention else [attn1.to_k, attn1.to_v])
    pairs = [(block.norm1, self_attention), (block.norm3, [getattr(ff.net[0], "proj", None)]),
             (ff.net[0], [ff.net[2]] if len(ff.net) > 2 else [])]
    if attn2 is not None:
        pairs.append((block.norm2, [attn2.to_q]))
    return pairs


def _text_consumers(blocks: list[nn.Module]) -> list[nn.Module]:
    """Cross-attention's key and value projections in every block (to_kv where fused): all take the text embedding."""
    attentions = [getattr(block, "attn2", None) for block in blocks]
    return [getattr(attn, name, None) for attn in attentions if getattr(attn, "is_cross_attention", False)
            for name in (("to_kv",) if getattr(attn, "fused_projections", False) else ("to_k", "to_v"))]


GELU_NEGATIVE_MAX = 0.17  # max |gelu(g)| over g < 0 (0.1700 at g = -0.75); gelu(g) <= g for g >= 0


def _normalized_size(norm: nn.LayerNorm) -> int:
    return math.prod(norm.normalized_shape)


def _gain(norm: nn.Module) -> float:
    """The largest |weight| of a LayerNorm or GroupNorm (1 without one)."""
    return norm.weight.detach().abs().max().item() if norm.weight is not None else 1.0


def _shift(norm: nn.Module) -> float:
    """The largest |bias| of a LayerNorm or GroupNorm (0 without one)."""
    return norm.bias.detach().abs().max().item() if norm.bias is not None else 0.0


def layer_norm_bound(norm: nn.LayerNorm) -> float:
    """A value no output of `norm` can exceed: the normalized row has mean 0 and sum of squares at most C, so no element
    exceeds sqrt(C - 1) in magnitude; then |y| <= sqrt(C - 1) max|weight| + max|bias|."""
    return BOUND_MARGIN * (math.sqrt(_normalized_size(norm) - 1) * _gain(norm) + _shift(norm))


def group_norm_bound(norm: nn.GroupNorm) -> GroupNormBound:
    """The same for a GroupNorm, whose groups hold channels times pixels values: its bound at a given image size
    (GroupNormBound.at, per call)."""
    return GroupNormBound(norm.num_channels // norm.num_groups, _gain(norm), _shift(norm))


def _layer_norm_row_norm(norm: nn.LayerNorm) -> float:
    """A bound on the Euclidean norm of one output row of `norm`: sqrt(C) max|weight| + ||bias||."""
    shift = norm.bias.detach().float().norm().item() if norm.bias is not None else 0.0
    return math.sqrt(_normalized_size(norm)) * _gain(norm) + shift


def _linear_weight(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) in fp32 of a Linear, or of an 8-bit layer (its dequantized weight: what it multiplies)."""
    if isinstance(layer, RocmQuantizedLinear):
        if layer.fp16_layer is not None:
            return _linear_weight(layer.fp16_layer)
        return dequantize_rows(layer.weight_q, layer.weight_scale.reshape(-1)), layer.bias
    if type(layer) is nn.Linear:
        return layer.weight.detach().float(), layer.bias
    return None


def geglu_bound(geglu: RocmGEGLU, norm: nn.LayerNorm) -> float | None:
    """A value no output of the GEGLU can exceed when its projection takes `norm`'s output (None when the projection's
    weight cannot be read). Each half's output j is bounded by Cauchy-Schwarz: |w_j . x + b_j| <= ||w_j|| L + |b_j|,
    L the bound on the input row's norm; |gelu(g)| <= max(|g|, 0.17); the bound is the largest product over j."""
    weights = _linear_weight(geglu.proj)
    if weights is None:
        return None
    weight, bias = weights
    reach = weight.norm(dim=1) * _layer_norm_row_norm(norm) * BOUND_MARGIN
    if bias is not None:
        reach = reach + bias.detach().float().abs()
    value, gate = reach.chunk(2)
    return float((value * gate.clamp_min(GELU_NEGATIVE_MAX)).max().item()) * BOUND_MARGIN


def _bounds(blocks: list[nn.Module]) -> dict[nn.Module, float]:
    """The producers whose outputs have a bound (layer_norm_bound, geglu_bound) and the bound: the LayerNorms of the
    blocks, and the GEGLU of each block that hands it norm3's output as it is (norm_type 'layer_norm')."""
    bounds: dict[nn.Module, float] = {}
    for block in blocks:
        for name in ("norm1", "norm2", "norm3"):
            norm = getattr(block, name, None)
            if isinstance(norm, RocmLayerNorm):
                bounds[norm] = layer_norm_bound(norm)
        geglu, norm3 = block.ff.net[0] if hasattr(block.ff, "net") else None, block.norm3
        if (isinstance(geglu, RocmGEGLU) and isinstance(norm3, RocmLayerNorm)
                and getattr(block, "norm_type", None) == "layer_norm"):
            bound = geglu_bound(geglu, norm3)
            if bound is not None and math.isfinite(bound) and bound > 0:
                bounds[geglu] = bound
    return bounds


def quantize_in_producers(model: nn.Module, record: PatchRecord, fmt: str,
                          originals: dict[nn.Module, nn.Module] | None = None) -> dict[nn.Module, list[nn.Module]]:
    """Where every layer taking a rocm_sd LayerNorm's or GEGLU's output is an 8-bit GEMM of `fmt`, that kernel writes
    the quantized output too (ops/quantized_outputs.py) and the GEMMs quantize nothing. Each 8-bit layer learns how
    many take its input and who quantizes it (`input_sharers`, `input_quantizer`: its tuning problem charges it its
    share of that cost); returns each layer's producers that write its input quantized.

    With `originals` (8-bit layer -> the layer it replaced: precision_scales 'tensor'), a producer with a bound
    (_bounds) writes one scale for its output, and its consumers' weights are quantized per tensor again from the
    originals: their GEMMs run per tensor."""
    blocks = [block for block in model.modules()
              if all(hasattr(block, name) for name in ("norm1", "attn1", "norm3", "ff", "only_cross_attention"))]
    groups = [pair for block in blocks for pair in _consumers(block)] + [(None, _text_consumers(blocks))]
    bounds = _bounds(blocks) if originals is not None else {}
    producers_of: dict[nn.Module, list[nn.Module]] = {}
    for producer, consumers in groups:
        quantized = [c for c in consumers if isinstance(c, RocmQuantizedLinear) and c.format == fmt]
        for layer in quantized:
            layer.input_sharers = len(quantized)
        if (isinstance(producer, (RocmLayerNorm, RocmGEGLU)) and consumers
                and len(quantized) == len(consumers)):
            producer.quantized_output = fmt
            record.on_revert(delattr, producer, "quantized_output")
            if isinstance(producer, RocmLayerNorm):  # a norm may write only its rows for them (modules/transformer.py)
                producer.quantized_consumers = tuple(quantized)
                record.on_revert(delattr, producer, "quantized_consumers")
            record.counts[f"{type(producer).__name__} writes {fmt}"] += 1
            bound = bounds.get(producer, 0.0)  # bounds come with `originals`, which holds every layer made 8-bit here
            if bound:
                producer.quantized_bound = bound
                record.on_revert(delattr, producer, "quantized_bound")
                record.counts[f"{type(producer).__name__} writes {fmt}, one scale per tensor"] += 1
            for layer in quantized:
                producers_of.setdefault(layer, []).append(producer)
                layer.input_quantizer = "geglu" if isinstance(producer, RocmGEGLU) else "norm"
                if bound:
                    layer.per_tensor_weight(originals[layer].weight)
                    layer.input_quantizer += "-tensor"
    for block in blocks:
        if feeds_8bit_directly(block.ff):
            record.replace_forward(block.ff, feed_forward_8bit, f"feed-forward: GEGLU writes only {fmt} rows")
    return producers_of
