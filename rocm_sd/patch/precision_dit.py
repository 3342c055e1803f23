"""optimize(precision="fp8" | "int8") for the diffusion transformers (SD3 / SD3.5 MMDiT, Flux): the linear layers of
their blocks as 8-bit GEMMs (modules/quantized_linear.py), the UNet's machinery (patch/precision.py) otherwise.

Replaced, in every JointTransformerBlock (SD3.5's second attention included), FluxTransformerBlock and
FluxSingleTransformerBlock: the attention projections (to_q / to_k / to_v or fuse_qkv's to_qkv, add_q / k / v_proj
or to_added_qkv, to_out, to_add_out), the feed-forward's linears (ff, ff_context), and a single block's proj_mlp and
proj_out. Where the single block runs its fused forward (modules/mmdit.py), proj_out becomes two 8-bit GEMMs over
its weight's column blocks (RocmQuantizedSplitLinear), as its fp16 forward splits it: no concatenation.

Kept as they are, as the UNet keeps its one-row layers (FEW_ROWS): the blocks' AdaLN modulation linears (norm*.linear:
one row per image), and everything outside the blocks: the time / guidance / pooled-text embedders (one row), the
model's patch embedding (x_embedder, Flux: 64 input features) and its final proj_out (64 output features), and the
context_embedder. That one has a row per text token, but it runs once per step at a fraction of a percent of the
step's multiply-adds, and its input is T5's output, whose few very large values would leave the rest of each row
with little of an 8-bit row's range: nothing to gain, the most to lose.

The activations are quantized per row (rocm_sd::quantize_rows), once per input whatever the number of layers taking
it (remember_rows: q, k, v and, in a single block, proj_mlp share the modulated norm's). Not per tensor from a bound
(precision_scales="tensor", the UNet's LayerNorm / GEGLU bounds): the AdaLN output is norm(x) * (1 + scale) + shift,
with scale and shift computed from the timestep and text per call, so no bound follows from the weights alone.
Not inside the norm's kernel either: rocm_sd::ada_layer_norm has no variant writing 8-bit rows (the next step, if
the quantize_rows pass shows in the profile).
"""
from __future__ import annotations

import torch
from torch import nn

from ..modules.mmdit import flux_single_block_forward
from ..modules.quantized_linear import RocmQuantizedLinear, RocmQuantizedSplitLinear, new_model_call
from .core import PatchRecord
from .diffusers import DIT_BLOCKS, park_in_cpu_memory

DIT_MODELS = ("SD3Transformer2DModel", "FluxTransformer2DModel")
# The layers taking one input, which quantize_rows quantizes once for all of them (the tuning problem's `shared`).
SHARED_INPUTS = (("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_qkv", "proj_mlp"),
                 ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_added_qkv"),
                 ("attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_qkv"))


def is_diffusion_transformer(model: nn.Module) -> bool:
    return type(model).__name__ in DIT_MODELS


def _blocks(model: nn.Module) -> dict[str, nn.Module]:
    return {path: m for path, m in model.named_modules()
            if type(m).__name__ in DIT_BLOCKS and type(m).__module__.startswith("diffusers.")}


def selected_name(name: str) -> bool:
    """Whether the linear layer at `name` inside one of diffusers' transformer blocks (DIT_BLOCKS; fuse_qkv's to_qkv
    and to_added_qkv included) is one that becomes 8-bit: all but the block's AdaLN modulation (norm1.linear,
    norm1_context.linear, norm.linear). The ComfyUI node selects by this rule too, under diffusers' names for
    ComfyUI's layers (patch/comfy_dit_precision.py)."""
    return not name.split(".")[0].startswith("norm")


def fits(in_features: int, out_features: int, multiple: int) -> bool:
    """The 8-bit GEMM's shape rule (patch/precision.MULTIPLE): both sizes multiples of `multiple`."""
    return in_features % multiple == 0 and out_features % multiple == 0


def _quantizable(module: nn.Module, multiple: int) -> bool:
    return (type(module) is nn.Linear and fits(module.in_features, module.out_features, multiple)
            and module.weight.dtype in (torch.float16, torch.bfloat16, torch.float32))


def _block_linears(block: nn.Module, multiple: int, unused: set[nn.Module]) -> list[tuple[str, nn.Module]]:
    """(name inside the block, layer) of the block's linear layers that become 8-bit (selected_name, fits), but for the
    projections a fused one replaced (`unused`)."""
    return [(name, m) for name, m in block.named_modules()
            if selected_name(name) and m not in unused and _quantizable(m, multiple)]


def selection(model: nn.Module, multiple: int, unused: set[nn.Module]) -> dict[str, list[tuple[str, nn.Module]]]:
    """{path of each of diffusers' transformer blocks in `model`: _block_linears of it}: the layers made 8-bit."""
    return {path: _block_linears(block, multiple, unused) for path, block in _blocks(model).items()}


def _split_fused(block: nn.Module, name: str) -> bool:
    """Whether `name` is the proj_out of a single block whose fused forward splits it into two GEMMs."""
    return name == "proj_out" and getattr(block.forward, "func", None) is flux_single_block_forward  # core.bind's


def quantize_transformer(model: nn.Module, record: PatchRecord, fmt: str, device: torch.device, multiple: int,
                         unused: set[nn.Module], measured: bool) -> None:
    """The blocks' linear layers as 8-bit GEMMs of `fmt` (the module doc says which); the originals wait in CPU
    memory until revert(), and with `measured` (precision_layers) each goes back to its original at its first call
    where the tuning database measured that faster."""
    layers = []  # (the block's name of the layer, 8-bit layer, its original)
    blocks = _blocks(model)
    for path, chosen in selection(model, multiple, unused).items():
        block = blocks[path]
        parents = dict(block.named_modules())
        quantized_here = {}
        for name, module in chosen:
            parent_name, _, child = name.rpartition(".")
            if _split_fused(block, name):
                split = RocmQuantizedSplitLinear(module, block.proj_mlp.in_features, fmt).to(device)
                record.replace_child(parents[parent_name], child, split)
                park_in_cpu_memory(module, record)  # before the halves' originals view its weight
                layers += zip((name, name), (split.first, split.second), split.originals(module))
                record.counts[f"linear -> {fmt} GEMM"] += 2
                record.counts[f"single block proj_out as two {fmt} GEMMs"] += 1
                continue
            quantized = RocmQuantizedLinear.from_module(module, fmt).to(device)
            record.replace_child(parents[parent_name], child, quantized)
            park_in_cpu_memory(module, record)
            layers.append((name, quantized, module))
            quantized_here[name] = quantized
            record.counts[f"linear -> {fmt} GEMM"] += 1
        for names in SHARED_INPUTS:
            sharing = [quantized_here[name] for name in names if name in quantized_here]
            for layer in sharing:
                layer.input_sharers = len(sharing)
    if not layers:
        why = (f"precision={record.flags['precision']} not applied: {type(model).__name__} has no linear layer in "
               f"diffusers' transformer blocks with features a multiple of {multiple}")
        record.skip_option("precision", why)
        return
    record.add_hook(model.register_forward_pre_hook(new_model_call))
    if measured:
        for _, layer, original in layers:
            layer.offer_fp16(original, [], record.counts)
