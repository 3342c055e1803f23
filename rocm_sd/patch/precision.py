"""optimize(precision="fp8" | "int8"): the UNet's linear layers (attention projections, feed-forward, proj_in /
proj_out, 1x1 convolutions) as 8-bit GEMMs (modules/quantized_linear.py).

The layers whose rows are few (the time and class embeddings, the resnets' time projections: one row per image)
stay as they are: an 8-bit GEMM of two rows saves nothing. The replaced layers' fp16 weights wait in CPU memory until
revert(), which puts them back: GPU memory holds the 8-bit weights only. With precision_layers="measured" (the
default) a layer goes back to fp16 at its first call where the tuning database measured that faster for its shape
(modules/quantized_linear.RocmQuantizedLinear.offer_fp16).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from .. import platform
from ..modules.geglu import RocmGEGLU, feed_forward_8bit, feeds_8bit_directly
from ..modules.layer_norm import RocmLayerNorm
from ..modules.pointwise import RocmPointwiseConv2d, is_pointwise
from ..modules.quantized_linear import FEW_ROWS, RocmQuantizedLinear, new_model_call
from ..ops.quantize import fp8_format
from .core import PatchRecord

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
    targets = [(name, module) for name, module in model.named_modules() if _eligible(name, module, MULTIPLE[precision])]
    parents = dict(model.named_modules())
    originals = {}
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        quantized = RocmQuantizedLinear.from_module(module, fmt).to(device)
        record.replace_child(parents[parent_name], child, quantized)
        record.on_revert(module.to, device)  # the fp16 weights come back to the GPU with the module
        module.to("cpu")
        originals[quantized] = module
        record.counts[f"{'conv1x1' if quantized.conv else 'linear'} -> {fmt} GEMM"] += 1
    if targets:
        record.add_hook(model.register_forward_pre_hook(new_model_call))
        producers = quantize_in_producers(model, record, fmt)
        if options["precision_layers"] == "measured":
            for layer, original in originals.items():
                layer.offer_fp16(original, producers.get(layer, []), record.counts)


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
    """Cross-attention's key and value projections in every block: all take the text embedding."""
    attentions = [getattr(block, "attn2", None) for block in blocks]
    return [getattr(attn, name, None) for attn in attentions if getattr(attn, "is_cross_attention", False)
            for name in ("to_k", "to_v")]


def quantize_in_producers(model: nn.Module, record: PatchRecord, fmt: str) -> dict[nn.Module, list[nn.Module]]:
    """Where every layer taking a rocm_sd LayerNorm's or GEGLU's output is an 8-bit GEMM of `fmt`, that kernel writes
    the quantized output too (ops/quantized_outputs.py) and the GEMMs quantize nothing. Each 8-bit layer learns how
    many take its input and who quantizes it (`input_sharers`, `input_quantizer`: its tuning problem charges it its
    share of that cost); returns each layer's producers that write its input quantized."""
    blocks = [block for block in model.modules()
              if all(hasattr(block, name) for name in ("norm1", "attn1", "norm3", "ff", "only_cross_attention"))]
    groups = [pair for block in blocks for pair in _consumers(block)] + [(None, _text_consumers(blocks))]
    producers_of: dict[nn.Module, list[nn.Module]] = {}
    for producer, consumers in groups:
        quantized = [c for c in consumers if isinstance(c, RocmQuantizedLinear) and c.format == fmt]
        for layer in quantized:
            layer.input_sharers = len(quantized)
        if (isinstance(producer, (RocmLayerNorm, RocmGEGLU)) and consumers
                and len(quantized) == len(consumers)):
            producer.quantized_output = fmt
            record.on_revert(delattr, producer, "quantized_output")
            record.counts[f"{type(producer).__name__} writes {fmt}"] += 1
            for layer in quantized:
                producers_of.setdefault(layer, []).append(producer)
                layer.input_quantizer = "geglu" if isinstance(producer, RocmGEGLU) else "norm"
    for block in blocks:
        if feeds_8bit_directly(block.ff):
            record.replace_forward(block.ff, feed_forward_8bit, f"feed-forward: GEGLU writes only {fmt} rows")
    return producers_of
