"""Which modules are which in UNets and VAEs of the latent-diffusion lineage (CompVis ldm, Stability's sgm, and the
copies of them in ComfyUI's comfy.ldm and A1111 / Forge), and the kernel-backed copies that replace them.

Host-neutral (docs/design.md, convention 10: one copy of the patch logic): patch/comfy.py installs these
swaps as ComfyUI object patches, patch/a1111.py in place on the webui's model. `host_path(module) -> bool` is the
host's say per call: True runs the module's own forward (weights the host casts or streams per call, LoRA computed
in the forward); it may also bring the module up to date first (the webui merges LoRA weights lazily per forward).

Every swap is made of the host's own module (original_modules): never of a copy made here, which another patched
version of the same model (a ComfyUI clone loaded right now) may have put in its place, nor of what that version's
patches show at the path. `resolve(path, module) -> module` is the host's say on which module a path holds for the
model being patched.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from ..modules.host_copies import (conv_channels_last_copy, fused_away, group_norm_copy, layer_norm_copy,
                                   quantized_linear_copy, unpatched, upsample_copy)
from ..modules.pointwise import is_pointwise
from ..modules.quantized_linear import FEW_ROWS, quantizable_weight
from ..modules.upsample import conv_foldable


def _never(module) -> bool:
    return False


Resolve = Callable[[str, nn.Module], object]


def original_modules(root, resolve: Resolve | None = None) -> dict[str, nn.Module]:
    """{dotted path: module} of root's tree as named_modules() lists it, each path's module as `resolve` says (the
    module itself without it) and unpatched() (modules/host_copies.py): the host's own modules, whatever copies of
    rocm_sd another patched version of the model has installed. Objects that are not modules end the walk there."""
    found: dict[str, nn.Module] = {}
    seen: set[int] = set()

    def visit(path: str, module) -> None:
        module = unpatched(resolve(path, module) if resolve is not None else module)
        if not isinstance(module, nn.Module) or id(module) in seen:
            return
        seen.add(id(module))
        found[path] = module
        for name, child in module._modules.items():
            if child is not None:
                visit(f"{path}.{name}" if path else name, child)

    visit("", root)
    return found


def norm_swaps(root, group_norm: bool = True, layer_norm: bool = True,
               host_path: Callable[[nn.Module], bool] = _never, resolve: Resolve | None = None) -> dict[str, object]:
    """{dotted path under root: replacement} for the norms of an ldm-lineage UNet or VAE.

    A GroupNorm directly followed by nn.SiLU inside an nn.Sequential is run as one fused call, with the
    SiLU replaced by Identity, except in a ResBlock's out_layers when it uses scale-shift norm (there the
    SiLU comes after the scale and shift). So are the VAE ResnetBlock's norm1 and norm2, whose forward
    applies its `swish` module right after each and nowhere else when the block has no time embedding
    (no `temb_proj`: ComfyUI's VAE blocks; ldm's and sgm's call a module-level `nonlinearity` instead, so theirs
    stay plain GroupNorms). Every other GroupNorm (ldm's GroupNorm32 too: the kernel computes in fp32 and returns
    the input's dtype, as GroupNorm32's float cast does), and every LayerNorm, is swapped alone.
    """
    modules = original_modules(root, resolve)

    def children(path: str) -> list[tuple[str, object]]:
        prefix = f"{path}." if path else ""
        return [(prefix + name, modules.get(prefix + name)) for name in modules[path]._modules]

    swaps: dict[str, object] = {}
    if group_norm:
        for parent_name, parent in modules.items():
            scale_shift = getattr(parent, "use_scale_shift_norm", False)
            for path, seq in children(parent_name):
                if not isinstance(seq, nn.Sequential) or (scale_shift and path.rpartition(".")[2] == "out_layers"):
                    continue
                items = children(path)
                for (name, module), (next_name, following) in zip(items, items[1:]):
                    if isinstance(module, nn.GroupNorm) and type(following) is nn.SiLU:
                        swaps[name] = group_norm_copy(module, "silu", host_path)
                        swaps[next_name] = fused_away(following)
        for name, block in modules.items():
            prefix = f"{name}." if name else ""
            norms = [modules.get(prefix + n) for n in ("norm1", "norm2")]
            if (type(modules.get(prefix + "swish")) is nn.SiLU and not hasattr(block, "temb_proj")
                    and all(isinstance(norm, nn.GroupNorm) for norm in norms)):
                swaps[prefix + "norm1"] = group_norm_copy(norms[0], "silu", host_path)
                swaps[prefix + "norm2"] = group_norm_copy(norms[1], "silu", host_path)
                swaps[prefix + "swish"] = fused_away(modules[prefix + "swish"])
        for name, module in modules.items():
            if isinstance(module, nn.GroupNorm) and name not in swaps:
                swaps[name] = group_norm_copy(module, None, host_path)
    if layer_norm:
        for name, module in modules.items():
            if isinstance(module, nn.LayerNorm):
                swaps[name] = layer_norm_copy(module, host_path)
    return swaps


def upsample_swaps(root, host_path: Callable[[nn.Module], bool] = _never,
                   resolve: Resolve | None = None) -> dict[str, object]:
    """{dotted path: replacement} for the VAE's Upsample modules (nearest 2x interpolation, then a 3x3 `conv`
    when `with_conv`): the folded 2x2 convolution of modules/upsample.py. The UNet's Upsample (`use_conv`) is not
    matched. Calls for which host_path(conv) is true take the module's own forward."""
    modules = original_modules(root, resolve)
    return {name: upsample_copy(module, host_path) for name, module in modules.items()
            if type(module).__name__ == "Upsample" and getattr(module, "with_conv", False)
            and conv_foldable(modules.get(f"{name}.conv" if name else "conv"))}


def conv_swaps(root, skip: dict | None = None, host_path: Callable[[nn.Module], bool] = _never,
               resolve: Resolve | None = None) -> dict[str, object]:
    """{dotted path: replacement} for every 2-D convolution of a UNet or VAE: the same convolution on a
    channels_last view of its weight (modules/host_copies.py), so that the model's activations run NHWC. The hosts
    keep their models NCHW, and on NCHW tensors cuDNN's and MIOpen's fast convolutions transpose every input, output
    and filter (bench/notes/comfyui.md). Convolutions under a path in `skip` (modules swapped whole, such as the
    folded upsamplers) are left to their owner."""
    skip = skip or {}
    return {name: conv_channels_last_copy(module, host_path) for name, module in original_modules(root, resolve).items()
            if isinstance(module, nn.Conv2d) and not any(name.startswith(owner + ".") for owner in skip)}


def quantized_linear_swaps(root, format: str, multiple: int, host_path: Callable[[nn.Module], bool] = _never,
                           resolve: Resolve | None = None) -> dict[str, object]:
    """{dotted path: replacement} for the Linears and 1x1 convolutions of an ldm-lineage UNet whose rows are many and
    whose input and output sizes are multiples of `multiple` (the GEMM's shape rule): the 8-bit GEMM of `format` on
    the module's current weight (modules/host_copies.quantized_linear_copy)."""
    swaps = {}
    for name, module in original_modules(root, resolve).items():
        if any(part in FEW_ROWS for part in name.split(".")):
            continue
        if isinstance(module, nn.Linear):
            n, k = module.out_features, module.in_features
        elif is_pointwise(module, any_class=True):
            n, k = module.out_channels, module.in_channels
        else:
            continue
        if n % multiple == 0 and k % multiple == 0 and quantizable_weight(module.weight):
            swaps[name] = quantized_linear_copy(module, format, host_path)
    return swaps


def _norm_consumers(block) -> dict[str, list]:
    """{norm: the layers that take its output} in an ldm BasicTransformerBlock: norm1 feeds self-attention's
    projections (only the query where the block's first attention is cross-attention, `disable_self_attn`), norm2
    cross-attention's query, norm3 the feed-forward's first projection (GEGLU's `proj`, or a Linear)."""
    ff = getattr(block.ff, "net", block.ff)  # ComfyUI's FeedForward keeps its layers in `net`
    first = ff[0] if isinstance(ff, nn.Sequential) and len(ff) else None
    project_in = getattr(first, "proj", None)
    if project_in is None:
        project_in = first[0] if isinstance(first, nn.Sequential) else first
    attn1, attn2 = block.attn1, getattr(block, "attn2", None)
    consumers = {"norm1": [attn1.to_q] if getattr(block, "disable_self_attn", False)
                 else [attn1.to_q, attn1.to_k, attn1.to_v],
                 "norm3": [project_in]}
    if attn2 is not None and hasattr(block, "norm2"):
        consumers["norm2"] = [attn2.to_q]
    return consumers


def quantized_input_groups(root, quantized: dict[str, object],
                           resolve: Resolve | None = None) -> list[tuple[str | None, list[str], bool]]:
    """Who takes which input among the `quantized` swaps (quantized_linear_swaps of the same root): per transformer
    block norm, (its dotted path, the quantized paths that take its output, whether every consumer is quantized: then
    the norm may write its output quantized for them); and (None, every block's quantized cross-attention keys and
    values, which all take the text embedding, False). Video blocks (norm_in and ff_in first) are left out."""
    modules = original_modules(root, resolve)
    by_module = {id(module): path for path, module in modules.items()}
    groups, text = [], []
    for name, block in modules.items():
        if (not all(hasattr(block, a) for a in ("norm1", "attn1", "norm3", "ff"))
                or isinstance(getattr(block, "ff_in", None), nn.Module)):
            continue
        prefix = f"{name}." if name else ""
        for norm, consumers in _norm_consumers(block).items():
            paths = [by_module.get(id(unpatched(c))) for c in consumers]
            taking = [p for p in paths if p in quantized]
            groups.append((prefix + norm, taking, bool(paths) and len(taking) == len(paths)))
        attn2 = getattr(block, "attn2", None)
        text += [by_module[id(unpatched(c))] for c in (getattr(attn2, "to_k", None), getattr(attn2, "to_v", None))
                 if c is not None and by_module.get(id(unpatched(c))) in quantized]
    return groups + [(None, text, False)]
