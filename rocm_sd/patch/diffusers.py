"""Where rocm_sd's modules go in diffusers models: one patcher per optimize() flag (patch/flags.py's table).

Each patcher finds what it replaces by exact class (subclasses may compute something else) and records how to
undo every change (core.PatchRecord). What replaces a module lives in rocm_sd/modules/.

GroupNorm fusions, each only where the module's forward is known to apply the two in sequence:
  - ResnetBlock2D (time_embedding_norm "default", or the VAE decoder's "group" without a time embedding;
    SiLU nonlinearity): norm1 and norm2 become GroupNorm+SiLU and `nonlinearity` becomes Identity; the one other
    use of `nonlinearity`, on the time embedding, moves into a forward pre-hook of the block on its `temb`
    argument, so the block computes the same.
  - conv_norm_out followed by conv_act (UNet2DConditionModel, UNet2DModel, the VAE's Encoder and Decoder):
    conv_norm_out becomes GroupNorm+SiLU and conv_act becomes Identity.
Every other nn.GroupNorm becomes a plain RocmGroupNorm.
"""
from __future__ import annotations

import torch
from torch import nn

from ..graphs import GraphedCall
from ..modules.attention import RocmAttnProcessor
from ..modules.geglu import RocmGEGLU
from ..modules.group_norm import RocmGroupNorm
from ..modules.layer_norm import RocmLayerNorm
from ..modules.pointwise import RocmPointwiseConv2d, is_pointwise
from ..modules.resnet import CACHE_ATTR as RESNET_CACHE_ATTR
from ..modules.resnet import fusable as resnet_fusable
from ..modules.resnet import plain_time_embedding, resnet_forward, silu_temb
from ..modules.transformer import fusable as transformer_block_fusable
from ..modules.transformer import transformer_block_forward, transformer_output_keeping_channels_last
from ..modules.upsample import CACHE_ATTR as UPSAMPLE_CACHE_ATTR
from ..modules.upsample import fusable as upsample_fusable
from ..modules.upsample import upsample_forward
from ..modules.host_copies import copy_as
from ..modules.joint_attention import RocmFluxAttnProcessor, RocmJointAttnProcessor
from ..modules.mmdit import (RocmGELU, flux_block_forward, flux_block_fusable, flux_single_block_forward,
                             flux_single_block_fusable, joint_block_forward, joint_block_fusable)
from ..modules.rms_norm import RocmRMSNorm
from ..modules.text_kv import TextKV, text_attentions
from ..modules.vae_tiles import tiled_decode
from .core import PatchRecord
from .flags import eight_bit

def _replace_children(model: nn.Module, record: PatchRecord, matches, make, count: str) -> None:
    """Every child module for which matches(child) becomes make(child), counted as `count`."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if matches(child):
                record.replace_child(parent, name, make(child))
                record.counts[count] += 1


# Classes whose forward runs `conv_act(conv_norm_out(x))` and uses conv_act nowhere else.
NORM_OUT_THEN_ACT = {"UNet2DConditionModel", "UNet2DModel", "Encoder", "Decoder"}


def _is_plain_group_norm(m) -> bool:
    return type(m) is nn.GroupNorm


def _fuse_resnet(block: nn.Module, record: PatchRecord) -> bool:
    if not (plain_time_embedding(block) and isinstance(block.nonlinearity, nn.SiLU)
            and _is_plain_group_norm(block.norm1) and _is_plain_group_norm(block.norm2)):
        return False
    record.replace_child(block, "norm1", RocmGroupNorm.from_group_norm(block.norm1, act="silu"))
    record.replace_child(block, "norm2", RocmGroupNorm.from_group_norm(block.norm2, act="silu"))
    record.replace_child(block, "nonlinearity", nn.Identity())
    if block.time_emb_proj is not None and not block.skip_time_act:
        record.add_hook(block.register_forward_pre_hook(silu_temb, with_kwargs=True))
    record.counts["group_norm+silu"] += 2
    return True


def patch_group_norms(model: nn.Module, record: PatchRecord) -> None:
    from diffusers.models.resnet import ResnetBlock2D

    for module in list(model.modules()):
        if isinstance(module, ResnetBlock2D):
            _fuse_resnet(module, record)
        elif (type(module).__name__ in NORM_OUT_THEN_ACT and _is_plain_group_norm(getattr(module, "conv_norm_out", None))
              and isinstance(getattr(module, "conv_act", None), nn.SiLU)):
            record.replace_child(module, "conv_norm_out", RocmGroupNorm.from_group_norm(module.conv_norm_out, "silu"))
            record.replace_child(module, "conv_act", nn.Identity())
            record.counts["group_norm+silu"] += 1
    _replace_children(model, record, _is_plain_group_norm, RocmGroupNorm.from_group_norm, "group_norm")


def patch_resnets(model: nn.Module, record: PatchRecord) -> None:
    from diffusers.models.resnet import ResnetBlock2D

    for block in model.modules():
        if type(block) is ResnetBlock2D and resnet_fusable(block):
            record.replace_forward(block, resnet_forward, "resnet fused", **{RESNET_CACHE_ATTR: {}})


def _is_t5_layer_norm(module: nn.Module) -> bool:
    return type(module).__name__ == "T5LayerNorm" and type(module).__module__.startswith("transformers.models.t5")


def patch_layer_norms(model: nn.Module, record: PatchRecord) -> None:
    _replace_children(model, record, lambda m: type(m) is nn.LayerNorm and len(m.normalized_shape) == 1,
                      RocmLayerNorm.from_layer_norm, "layer_norm")
    _replace_children(model, record, _is_t5_layer_norm, RocmRMSNorm.from_t5_layer_norm, "rms_norm")


# The diffusion transformers' blocks (modules/mmdit.py): class name -> (fusable, fused forward, count).
DIT_BLOCKS = {
    "JointTransformerBlock": (joint_block_fusable, joint_block_forward, "MMDiT block fused"),
    "FluxTransformerBlock": (flux_block_fusable, flux_block_forward, "Flux double block fused"),
    "FluxSingleTransformerBlock": (flux_single_block_fusable, flux_single_block_forward, "Flux single block fused"),
}


def patch_transformer_blocks(model: nn.Module, record: PatchRecord) -> None:
    from diffusers.models.attention import BasicTransformerBlock

    for block in model.modules():
        if type(block) is BasicTransformerBlock and transformer_block_fusable(block):
            record.replace_forward(block, transformer_block_forward, "transformer block fused")
        elif type(block).__name__ in DIT_BLOCKS and type(block).__module__.startswith("diffusers."):
            fusable, forward, count = DIT_BLOCKS[type(block).__name__]
            if fusable(block):
                record.replace_forward(block, forward, count)


def patch_transformer_layouts(model: nn.Module, record: PatchRecord) -> None:
    for module in model.modules():
        if type(module).__name__ == "Transformer2DModel" and hasattr(module, "_get_output_for_continuous_inputs"):
            record.bind(module, "_get_output_for_continuous_inputs", transformer_output_keeping_channels_last)
            record.counts["transformer output kept channels_last"] += 1


def _is_diffusers_geglu(module: nn.Module) -> bool:
    # Exactly diffusers' class, with exact gelu: subclasses may compute something else.
    return (type(module).__name__ == "GEGLU" and type(module).__module__ == "diffusers.models.activations"
            and isinstance(getattr(module, "proj", None), nn.Linear))


def patch_geglus(model: nn.Module, record: PatchRecord) -> None:
    _replace_children(model, record, _is_diffusers_geglu, RocmGEGLU.from_geglu, "geglu")


def _is_diffusers_gelu_tanh(module: nn.Module) -> bool:
    return (type(module).__name__ == "GELU" and type(module).__module__ == "diffusers.models.activations"
            and module.approximate == "tanh" and type(getattr(module, "proj", None)) is nn.Linear)


def patch_gelus(model: nn.Module, record: PatchRecord) -> None:
    _replace_children(model, record, _is_diffusers_gelu_tanh, RocmGELU.from_gelu, "linear+gelu(tanh)")


def patch_pointwise_convs(model: nn.Module, record: PatchRecord) -> None:
    _replace_children(model, record, is_pointwise, lambda m: copy_as(m, RocmPointwiseConv2d), "conv1x1 as GEMM")


def patch_upsamplers(model: nn.Module, record: PatchRecord) -> None:
    from diffusers.models.upsampling import Upsample2D

    for module in model.modules():
        if type(module) is Upsample2D and upsample_fusable(module):
            record.replace_forward(module, upsample_forward, "upsample+conv folded", **{UPSAMPLE_CACHE_ATTR: {}})


# diffusers' processors rocm_sd replaces, and with what (each takes the replaced one for calls it does not cover).
REPLACED = {"AttnProcessor2_0": RocmAttnProcessor, "FusedAttnProcessor2_0": RocmAttnProcessor,
            "JointAttnProcessor2_0": RocmJointAttnProcessor, "FusedJointAttnProcessor2_0": RocmJointAttnProcessor,
            "FluxAttnProcessor": RocmFluxAttnProcessor}


def patch_attention(model: nn.Module, record: PatchRecord) -> None:
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    for module in model.modules():
        if not isinstance(module, (Attention, AttentionModuleMixin)):
            continue
        old = module.processor
        replacement = REPLACED.get(type(old).__name__) if type(old).__module__.startswith("diffusers.") else None
        if replacement is None:
            record.counts[f"attention kept: {type(old).__name__}"] += 1
            continue
        module.set_processor(replacement(old))
        record.on_revert(module.set_processor, old)
        record.counts["attention processor"] += 1


def tile_vae_decode(model: nn.Module, record: PatchRecord) -> None:
    """AutoencoderKL's _decode (which decode calls per latent batch or slice) decodes in fixed-shape tiles."""
    if type(model).__name__ == "AutoencoderKL":
        record.bind(model, "_decode", tiled_decode)
        record.counts["decode in fixed-shape tiles"] += 1


# The calls graph capture wraps per model class: (method, keyword arguments the method ignores).
# AutoencoderKL.decode takes the pipeline's `generator` and does not use it.
GRAPHED_CALLS = {
    "UNet2DConditionModel": [("forward", ())],
    "UNet2DModel": [("forward", ())],
    "ControlNetModel": [("forward", ())],
    "AutoencoderKL": [("decode", ("generator",))],
    "CLIPTextModel": [("forward", ())],
    "CLIPTextModelWithProjection": [("forward", ())],
    "SD3Transformer2DModel": [("forward", ())],
    "FluxTransformer2DModel": [("forward", ())],
    "T5EncoderModel": [("forward", ())],
}


def install_graphs(model: nn.Module, record: PatchRecord) -> None:
    """The model's calls replay captured CUDA/HIP graphs, one per input shape, in the pipeline's one memory pool.

    Where a Python controller stands in a method's place (the step cache's UNetStepCache), the calls it names in
    its GRAPHED_CALLS are graphed instead, each its own GraphedCall (reported as '<method> (<call>)'), with the options
    its GRAPH_OPTIONS give that call (buffers passed in place, outputs not cloned), and the controller's deciding stays
    eager around them."""
    pool = record.graph_pool
    for method, ignored in GRAPHED_CALLS.get(type(model).__name__, []):
        owner = getattr(model, method)
        calls = getattr(owner, "GRAPHED_CALLS", ())
        targets = [(owner, name, f"{method} ({name})") for name in calls] or [(model, method, method)]
        for obj, name, key in targets:
            options = getattr(owner, "GRAPH_OPTIONS", {}).get(name, {})
            call = GraphedCall(getattr(obj, name), model, f"{type(model).__name__}.{key}", ignored, pool, **options)
            record.set_attr(obj, name, call)
            # their memory at revert: a step-cache controller and its graphed calls reference each other, and
            # cycles wait for the cycle collector
            record.on_revert(call.clear)
            record.graphed[key] = call
            record.counts[f"graphed: {key}"] += 1


# The models whose forward takes the text as its third argument (encoder_hidden_states) and hands it to every
# cross-attention module as it is (modules/text_kv.py).
TEXT_KV_MODELS = {"UNet2DConditionModel", "ControlNetModel"}


def reuse_text_kv(model: nn.Module, record: PatchRecord) -> None:
    """The model's forward becomes a TextKV around whatever stands there (the graphed call, a step cache): the
    cross-attention keys and values of a text are computed once, by a graph of their own where graphs are on."""
    if type(model).__name__ not in TEXT_KV_MODELS:
        return
    attentions = text_attentions(model)
    if not attentions:
        return
    memo = TextKV(model, model.forward, record.counts, record.clear_graphs)
    if record.flags.get("cuda_graph"):
        call = GraphedCall(memo.compute, model, f"{type(model).__name__}.text keys and values", (), record.graph_pool)
        record.set_attr(memo, "compute", call)
        record.on_revert(call.clear)
        record.graphed["text keys and values"] = call
    for attn in attentions:
        record.set_attr(attn.processor, "text_kv", memo)
    record.set_attr(model, "forward", memo)
    record.on_revert(memo.forget)
    record.on_invalidate(memo.forget)
    record.counts["cross-attention keys and values once per text"] += len(attentions)


def to_channels_last(model: nn.Module, record: PatchRecord) -> None:
    model.to(memory_format=torch.channels_last)
    record.on_revert(model.to, memory_format=torch.contiguous_format)
    record.counts["channels_last"] += 1
    patch_transformer_layouts(model, record)


def _unfuse_qkv(model: nn.Module, added: list[tuple[nn.Module, str]]) -> None:
    model.unfuse_qkv_projections()  # restores the processors, but leaves the fused Linear modules
    for module, name in added:
        if name in module._modules:  # the transformers' unfuse_projections removes its own already
            delattr(module, name)
        if hasattr(module, "fused_projections"):
            module.fused_projections = False


def fused_away(attn: nn.Module) -> list[nn.Module]:
    """The projections of a fused attention module that no call reaches while it is fused: to_q, to_k and to_v beside
    to_qkv (self-attention), to_k and to_v beside to_kv (cross-attention), add_q_proj, add_k_proj and add_v_proj
    beside to_added_qkv (the diffusion transformers' joint attention)."""
    if not getattr(attn, "fused_projections", False):
        return []
    names = ("to_q", "to_k", "to_v") if hasattr(attn, "to_qkv") else ("to_k", "to_v") if hasattr(attn, "to_kv") else ()
    if hasattr(attn, "to_added_qkv"):  # the diffusion transformers' text stream
        names += ("add_q_proj", "add_k_proj", "add_v_proj")
    return [getattr(attn, name) for name in names]


def park_in_cpu_memory(module: nn.Module, record: PatchRecord) -> None:
    """Moves `module` to CPU memory until revert() brings it back to its device (a meta module, which holds no
    memory, stays: the tuner's listing without a GPU)."""
    device = next(module.parameters()).device
    if device.type not in ("cpu", "meta"):
        record.on_revert(module.to, device)
        module.to("cpu")


def _fusing_then_parking(attn: nn.Module, record: PatchRecord):
    def fuse_projections(*args, **kwargs):  # Attention's takes `fuse`, AttentionModuleMixin's (Flux's) nothing
        type(attn).fuse_projections(attn, *args, **kwargs)
        for module in fused_away(attn):
            park_in_cpu_memory(module, record)
    return fuse_projections


def fuse_qkv(model: nn.Module, record: PatchRecord) -> None:
    fuse = getattr(model, "fuse_qkv_projections", None)
    if fuse is None:
        return
    before = {id(m): set(m._modules) for m in model.modules()}
    attentions = [m for m in model.modules() if hasattr(type(m), "fuse_projections")]
    if eight_bit(record.flags):
        # diffusers fuses every attention module before it returns, the separate projections still on the GPU: their
        # size again. An 8-bit precision never uses them, so each module's wait in CPU memory as soon as it is fused.
        for attn in attentions:
            attn.fuse_projections = _fusing_then_parking(attn, record)
    try:
        fuse()
    finally:
        for attn in attentions:
            vars(attn).pop("fuse_projections", None)
    added = [(m, name) for m in model.modules() if id(m) in before for name in set(m._modules) - before[id(m)]]
    record.on_revert(_unfuse_qkv, model, added)
    record.counts["fused qkv"] += 1
