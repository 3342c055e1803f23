"""The ComfyUI node's precision option on ComfyUI's diffusion transformers, SD3 / SD3.5 (MMDiT) and Flux
(patch/comfy_dit_precision.py): the blocks' linear layers that optimize(precision=...) quantizes in diffusers'
transformers, as 8-bit GEMMs of the weights ComfyUI has at call time, against the stand-ins of ComfyUI's interfaces
(tests/standins). A CPU has no 8-bit GEMMs: with the device check answered, the layers compute the same product from
the dequantized operands (modules/quantized_linear.linear_8bit); unanswered, the node says why."""
from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

from rocm_sd import config, dispatch
from rocm_sd.modules.host_copies import unpatched
from rocm_sd.modules.quantized_linear import RocmQuantizedLinear
from rocm_sd.patch import comfy as comfy_patch
from rocm_sd.patch import comfy_dit_precision, precision, precision_dit
from tests.test_comfyui_dit import MODELS, dit_inputs, dit_model, run

FORMATS = {"fp8": "e4m3fn", "int8": "int8"}


@pytest.fixture
def eight_bit_here(monkeypatch):
    """The device check answered for the CPU (e4m3fn for fp8): the layers multiply the dequantized operands."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: (FORMATS[p], None))


@pytest.fixture
def loader(comfy):
    import comfy.model_management as model_management

    model_management.unload_all_models()
    yield model_management
    model_management.unload_all_models()


def model(comfy, name, device="cpu", dtype=torch.float32, **kw):
    """The stand-in model with its Linears at the scale torch's own initialisation gives (uniform in +-1/sqrt(fan_in),
    as diffusers' tiny transformers have): the stand-in's N(0, 0.2) everywhere makes logits so large that fp8's
    rounding shows several times over after a few blocks, which says nothing about the layers."""
    patcher = dit_model(comfy, name, device, dtype, **kw)
    g = torch.Generator().manual_seed(3)
    for m in patcher.model.modules():
        if isinstance(m, nn.Linear):
            bound = 1 / math.sqrt(m.in_features)
            m.weight.data.copy_(torch.rand(m.weight.shape, generator=g).mul_(2 * bound).sub_(bound))
    return patcher


def family(name: str) -> str:
    return MODELS[name][0]


def evaluate(patcher, name, x, ctx, extra):
    """One evaluation with the patcher's object patches in place."""
    patcher.patch_model()
    try:
        return run(patcher, x, ctx, extra, family(name))
    finally:
        patcher.unpatch_model()


def optimize(nodes, patcher, **options):
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False, **options)
    return optimized


def eight_bit_patches(patcher) -> dict[str, nn.Module]:
    return {k: m for k, m in patcher.object_patches.items() if hasattr(m, "rocm_sd_refresh")}


def error(got, reference) -> float:
    return ((got - reference).abs().max() / reference.abs().max()).item()


# ---- which layers ------------------------------------------------------------------------------------------------

DIFFUSERS = {"sd35m": "tiny-sd3", "flux": "tiny-flux"}  # the same blocks: SD3.5 Medium's dual attention first, the
# last block's text stream pre-only; Flux's two double and two single blocks
BLOCK_LISTS = {"joint_blocks": "transformer_blocks", "double_blocks": "transformer_blocks",
               "single_blocks": "single_transformer_blocks"}


def diffusers_transformer(arch: str, **changes):
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    from rocm_sd.dit_models import ARCHITECTURES
    from rocm_sd.patch.diffusers import fused_away

    spec = ARCHITECTURES[arch]
    cls = SD3Transformer2DModel if spec.family == "sd3" else FluxTransformer2DModel
    transformer = cls(**{**spec.transformer, **changes})
    transformer.fuse_qkv_projections()  # fuse_qkv: 8-bit's default in optimize()
    return transformer, {m for attn in transformer.modules() for m in fused_away(attn)}


@pytest.mark.parametrize("multiple", [8, 16])
@pytest.mark.parametrize("name,width", [("sd35m", None), ("flux", None), ("flux", 24)])
def test_the_selection_is_diffusers_selection_for_the_same_blocks(comfy, name, width, multiple):
    """Per block, the diffusers names of the ComfyUI layers the node makes 8-bit are the layers optimize() makes 8-bit
    in diffusers' block of the same structure, at both formats' shape rules: with Flux 24 wide (not a multiple of
    16) neither takes any layer for fp8, both take all for int8."""
    changes, standin = ({}, {}) if width is None else (
        {"attention_head_dim": width // 2, "axes_dims_rope": (4, 4, 4)}, {"hidden_size": width, "axes_dim": (4, 4, 4)})
    transformer, unused = diffusers_transformer(DIFFUSERS[name], **changes)
    theirs = {path: {n for n, _ in layers} for path, layers in precision_dit.selection(transformer, multiple,
                                                                                     unused).items()}
    ours = {path: set() for path in theirs}
    for path, names in comfy_dit_precision.dit_selection(model(comfy, name, **standin).model.diffusion_model,
                                                         multiple).items():
        blocks, index, _ = path.split(".", 2)
        ours.setdefault(f"{BLOCK_LISTS[blocks]}.{index}", set()).update(names)
    assert ours == theirs
    assert any(theirs.values()) == (width is None or width % multiple == 0)


def test_the_modulations_and_the_layers_outside_the_blocks_stay_comfyuis(comfy, eight_bit_here, nodes):
    """As in diffusers: the AdaLN modulations and everything outside the blocks (embedders, final layer) stay as they
    are; every other Linear of the blocks is 8-bit."""
    for name in ("sd35m", "flux"):
        patcher = model(comfy, name)
        layers = set(eight_bit_patches(optimize(nodes, patcher, precision="fp8")))
        linears = {f"diffusion_model.{k}" for k, m in patcher.model.diffusion_model.named_modules()
                   if isinstance(m, nn.Linear)}
        in_blocks = {k for k in linears if k.split(".")[1] in BLOCK_LISTS}
        modulations = {k for k in in_blocks if k.endswith(("adaLN_modulation.1", "_mod.lin", "modulation.lin"))}
        assert modulations and layers == in_blocks - modulations, layers ^ (in_blocks - modulations)


def test_a_layer_whose_sizes_do_not_fit_the_gemm_is_left_alone(comfy):
    patcher = model(comfy, "sd35m")
    block = patcher.model.diffusion_model.joint_blocks[0].x_block
    block.mlp.fc2 = nn.Linear(block.mlp.fc2.in_features, 120)  # 120: a multiple of 8, not of 16
    fp8 = comfy_dit_precision.dit_selection(patcher.model.diffusion_model, 16)
    int8 = comfy_dit_precision.dit_selection(patcher.model.diffusion_model, 8)
    assert "joint_blocks.0.x_block.mlp.fc2" in int8 and "joint_blocks.0.x_block.mlp.fc2" not in fp8
    assert set(int8) - set(fp8) == {"joint_blocks.0.x_block.mlp.fc2"}


# ---- the node ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,choice", [("sd35m", "fp8"), ("sd35", "fp8"), ("flux", "fp8"), ("flux", "int8")])
def test_the_blocks_linears_run_8bit_and_unpatching_restores_the_model(comfy, nodes, eight_bit_here, name, choice):
    patcher = model(comfy, name)
    x, ctx, extra = dit_inputs()
    reference = run(patcher, x, ctx, extra, family(name))
    unquantized = evaluate(optimize(nodes, patcher), name, x, ctx, extra)
    originals = dict(patcher.model.named_modules())
    state = {k: v.clone() for k, v in patcher.model.state_dict().items()}
    notes = comfy_patch.patch_model_patcher(patcher.clone(), precision=choice, cuda_graph=False)
    assert not any("precision" in n for n in notes), notes
    optimized = optimize(nodes, patcher, precision=choice)
    layers = eight_bit_patches(optimized)
    selected = comfy_dit_precision.dit_selection(patcher.model.diffusion_model, precision.MULTIPLE[choice])
    assert sorted(layers) == sorted(f"diffusion_model.{p}" for p in selected)
    assert all(m.rocm_sd_format == FORMATS[choice] and unpatched(m) is originals[k] for k, m in layers.items())
    blocks = [k for k, m in optimized.object_patches.items() if type(m).__name__.startswith("Rocm")
              and k not in layers]
    assert blocks, "the fused block copies are installed beside the 8-bit layers"
    optimized.patch_model()
    try:
        with config.override(log_fallbacks=False):
            dispatch.reset_stats()
            got = run(optimized, x, ctx, extra, family(name))
            stats = dispatch.stats()
        assert optimized.model.state_dict().keys() == state.keys()  # 8-bit weights: buffers out of the state dict
        assert all(m.rocm_sd_weight_q is not None for m in layers.values())  # every layer ran its 8-bit GEMM
    finally:
        optimized.unpatch_model()
    assert stats["quantize_rows"]["torch"] >= len(layers) and stats["ada_layer_norm"]
    assert torch.isfinite(got).all() and 0 < error(got, unquantized) < 0.1  # 0.002-0.01 here
    assert dict(patcher.model.named_modules()) == originals
    assert all(torch.equal(v, state[k]) for k, v in patcher.model.state_dict().items())
    assert torch.equal(run(patcher, x, ctx, extra, family(name)), reference)


@pytest.mark.parametrize("name,choice", [("sd35m", "fp8"), ("sd35", "int8"), ("flux", "fp8"), ("flux", "int8")])
def test_norms_and_gelus_write_the_8bit_rows_and_change_nothing(comfy, nodes, eight_bit_here, monkeypatch, name,
                                                               choice):
    """Once the layers' first calls have decided (precision_layers="measured", nothing measured: all stay 8-bit), each
    AdaLN in front of an 8-bit qkv / fc1 / linear1 and each GELU in front of an 8-bit fc2 writes only its consumer's
    rows, as in diffusers' blocks: fewer quantize_rows passes, the same output bit for bit as the plain path (the norm's
    output, then the layers quantizing it). bf16: the producers' kernels take 16-bit rows (an fp32 model takes the
    plain path)."""
    patcher = model(comfy, name, dtype=torch.bfloat16)
    x, ctx, extra = dit_inputs(2, "cpu", torch.bfloat16)
    optimized = optimize(nodes, patcher, precision=choice)
    layers = eight_bit_patches(optimized)
    optimized.patch_model()
    try:
        with config.override(log_fallbacks=False):
            first = run(optimized, x, ctx, extra, family(name))  # the first calls decide: the plain path
            assert all(m.rocm_sd_fp16_offer is None and not m.rocm_sd_fp16 for m in layers.values())
            dispatch.reset_stats()
            fused = run(optimized, x, ctx, extra, family(name))
            stats = dispatch.stats()
            from rocm_sd.modules import mmdit_8bit

            monkeypatch.setattr(mmdit_8bit, "producers_write_rows", lambda x=None: False)
            dispatch.reset_stats()
            plain = run(optimized, x, ctx, extra, family(name))
            plain_stats = dispatch.stats()
    finally:
        optimized.unpatch_model()
    for op in ("ada_layer_norm_quantized", "add_ada_layer_norm_quantized", "gelu_tanh_quantized"):
        assert sum(stats.get(op, {}).values()) > 0, (op, stats)
        assert op not in plain_stats
    assert sum(stats["quantize_rows"].values()) < sum(plain_stats["quantize_rows"].values())
    assert torch.equal(fused, plain)
    torch.testing.assert_close(first, plain)  # a GEMM a batch (the joint rows in place) rounds as its own blocking


@pytest.mark.parametrize("choice", ["fp8", "int8"])
def test_flux_single_blocks_run_their_8bit_layers_in_blocks(comfy, nodes, eight_bit_here, monkeypatch, choice):
    """From the first call on, a single block's 8-bit linear1 runs as two GEMMs of one quantization of its
    input (qkv; the MLP's, whose GELU writes linear2's rows) and linear2 as two GEMMs of [attention, MLP] into one
    output: neither copy's own forward runs (so no concatenation is written), the output within fp8's reach of the
    unquantized node's."""
    from rocm_sd.modules.quantized_linear import QuantizedHostCopy

    patcher = model(comfy, "flux", dtype=torch.bfloat16)
    x, ctx, extra = dit_inputs(2, "cpu", torch.bfloat16)
    unquantized = evaluate(optimize(nodes, patcher), "flux", x, ctx, extra)
    optimized = optimize(nodes, patcher, precision=choice)
    singles = {m for k, m in eight_bit_patches(optimized).items() if k.endswith((".linear1", ".linear2"))}
    assert len(singles) == 4  # two single blocks
    called = []
    forward = QuantizedHostCopy.forward
    monkeypatch.setattr(QuantizedHostCopy, "forward",
                        lambda self, *a, **k: (called.append(self), forward(self, *a, **k))[1])
    optimized.patch_model()
    try:
        with config.override(log_fallbacks=False):
            run(optimized, x, ctx, extra, "flux")  # the first calls decide: the blocks make their layers' choice
            dispatch.reset_stats()
            got = run(optimized, x, ctx, extra, "flux")
            stats = dispatch.stats()
    finally:
        optimized.unpatch_model()
    assert not singles & set(called) and called  # the double blocks' layers still run their own forwards
    assert sum(stats["gelu_tanh_quantized"].values()) == 2 + 2 * 2  # each single block's, each double block's two
    assert torch.isfinite(got).all() and 0 < error(got, unquantized) < 0.1


def test_an_fp32_model_takes_the_plain_8bit_path(comfy, nodes, eight_bit_here):
    """The quantizing producers' kernels take 16-bit rows: in fp32 the norms write their output and the 8-bit layers
    quantize it, from the first call on and after."""
    patcher = model(comfy, "flux")
    x, ctx, extra = dit_inputs()
    optimized = optimize(nodes, patcher, precision="fp8")
    optimized.patch_model()
    try:
        with config.override(log_fallbacks=False):
            dispatch.reset_stats()
            for _ in range(2):
                run(optimized, x, ctx, extra, "flux")
            stats = dispatch.stats()
    finally:
        optimized.unpatch_model()
    assert stats["ada_layer_norm"] and stats["quantize_rows"]
    assert not {"ada_layer_norm_quantized", "add_ada_layer_norm_quantized", "gelu_tanh_quantized"} & set(stats)


def test_layer_norm_off_still_quantizes_the_layers_comfyuis_blocks_call(comfy, nodes, eight_bit_here):
    """The 8-bit layers sit at the Linears' own paths: ComfyUI's own block forwards call them too."""
    patcher = model(comfy, "flux")
    x, ctx, extra = dit_inputs()
    optimized = optimize(nodes, patcher, precision="fp8", layer_norm=False)
    assert set(optimized.object_patches) == set(eight_bit_patches(optimized)) != set()
    with config.override(log_fallbacks=False):
        dispatch.reset_stats()
        got = evaluate(optimized, "flux", x, ctx, extra)
        assert dispatch.stats()["quantize_rows"]["torch"] and "ada_layer_norm" not in dispatch.stats()
    assert 0 < error(got, run(patcher, x, ctx, extra, "flux")) < 0.1


def test_on_a_cpu_the_node_says_why_and_keeps_the_rest(comfy, nodes, caplog):
    """Without the device check answered: the reason optimize() gives on diffusers' transformers, once per execution;
    the blocks are still fused, nothing is 8-bit, and the output is the node's without precision."""
    patcher = model(comfy, "flux")
    x, ctx, extra = dit_inputs()
    plain = evaluate(optimize(nodes, patcher), "flux", x, ctx, extra)
    with caplog.at_level(logging.WARNING, logger="rocm_sd.comfyui"):
        optimized = optimize(nodes, patcher, precision="fp8")
    messages = [r.getMessage() for r in caplog.records if "precision" in r.getMessage()]
    assert messages == ["rocm_sd: precision=fp8 not applied: the model is on cpu; 8-bit GEMMs need a GPU"]
    assert not eight_bit_patches(optimized) and "diffusion_model.double_blocks.0" in optimized.object_patches
    assert torch.equal(evaluate(optimized, "flux", x, ctx, extra), plain)


def test_layers_go_back_to_comfyuis_forward_where_measured_faster(comfy, nodes, eight_bit_here, monkeypatch):
    """precision_layers="measured": each layer asks the database at its first call, with its own input (shared=1,
    quantized by the layer: ComfyUI's qkv and linear1 are one layer each); where it says torch the layer runs
    ComfyUI's forward from then on, its 8-bit weight freed."""
    from tests.test_precision import _Database, _shape

    database = _Database(lambda key: dispatch.TORCH)
    monkeypatch.setattr(dispatch, "_tuning", database)
    patcher = model(comfy, "flux")
    x, ctx, extra = dit_inputs()
    plain = evaluate(optimize(nodes, patcher), "flux", x, ctx, extra)
    optimized = optimize(nodes, patcher, precision="fp8")
    layers = eight_bit_patches(optimized)
    with config.override(log_fallbacks=False):
        got = evaluate(optimized, "flux", x, ctx, extra)
    assert all(m.rocm_sd_fp16 and m.rocm_sd_weight_q is None for m in layers.values())
    assert len(database.asked) == len(layers)
    assert {(s["shared"], s["input"]) for s in map(_shape, database.asked)} == {("1", "rows")}
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-5)
    database.asked.clear()
    evaluate(optimize(nodes, patcher, precision="fp8", precision_layers="all"), "flux", x, ctx, extra)
    assert database.asked == []


# ---- ComfyUI's weights: LoRA, low VRAM, its own formats, re-queues ------------------------------------------------

LORA_KEYS = {"sd35m": ["joint_blocks.0.x_block.attn.qkv.weight", "joint_blocks.1.context_block.attn.qkv.weight",
                       "joint_blocks.0.x_block.mlp.fc1.weight"],
             "flux": ["double_blocks.0.img_attn.qkv.weight", "double_blocks.1.txt_mlp.2.weight",
                      "single_blocks.0.linear1.weight", "single_blocks.1.linear2.weight"]}


def lora(patcher, name, strength=1.0, seed=7):
    """A clone with a LoRA-style "diff" patch on some of the 8-bit layers' weights."""
    g = torch.Generator().manual_seed(seed)
    state = patcher.model.state_dict()
    keys = [f"diffusion_model.{k}" for k in LORA_KEYS[name]]
    clone = patcher.clone()
    clone.add_patches({k: (torch.randn(state[k].shape, generator=g) * 0.05,) for k in keys}, strength)
    return clone


def merged(comfy, name, strength=1.0):
    """The stand-in model with lora()'s patch added into its weights: what the 8-bit layers must multiply."""
    patcher = model(comfy, name)
    patched = lora(patcher, name, strength)
    patched.patch_model()
    state = {k: v.clone() for k, v in patched.model.state_dict().items()}
    patched.unpatch_model()
    fresh = model(comfy, name)
    fresh.model.load_state_dict(state)
    return fresh


def sample_once(patcher, name, x, ctx, extra):
    """One evaluation as a KSampler runs it: ComfyUI loads the MODEL, and it stays loaded after."""
    import comfy.model_management

    comfy.model_management.load_models_gpu([patcher])
    return run(patcher, x, ctx, extra, family(name))


@pytest.mark.parametrize("name", ["sd35m", "flux"])
def test_lora_patches_reach_the_8bit_layers(comfy, nodes, eight_bit_here, loader, name):
    """ComfyUI patches the LoRA into the weights as it loads the MODEL: the 8-bit layers quantize the patched weights,
    exactly as they quantize a model whose weights hold the LoRA already."""
    x, ctx, extra = dit_inputs()
    with config.override(log_fallbacks=False):
        want = sample_once(optimize(nodes, merged(comfy, name), precision="fp8"), name, x, ctx, extra)
        loader.unload_all_models()
        base = model(comfy, name)
        without = sample_once(optimize(nodes, base, precision="fp8"), name, x, ctx, extra)
        loader.unload_all_models()
        got = sample_once(optimize(nodes, lora(base, name), precision="fp8"), name, x, ctx, extra)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert error(without, want) > 1e-3  # the patch matters


@pytest.mark.parametrize("name", ["sd35m", "flux"])
def test_a_requeue_never_bakes_in_another_clones_weights(comfy, nodes, eight_bit_here, loader, name):
    """Issue 46 item 0's orders with precision on: the node run while a LoRA'd clone is loaded, a re-queue after a
    LoRA strength change, the optimized model after a plain one and with a LoRA added after it. Each samples as the
    8-bit model of its own weights does with nothing loaded before it."""
    x, ctx, extra = dit_inputs()
    with config.override(log_fallbacks=False):
        def alone(patcher):
            loader.unload_all_models()
            out = sample_once(optimize(nodes, patcher, precision="fp8"), name, x, ctx, extra)
            loader.unload_all_models()
            return out

        own, full, half = alone(model(comfy, name)), alone(merged(comfy, name)), alone(merged(comfy, name, 0.5))
        assert error(full, own) > 1e-3 and error(half, full) > 1e-4

        def close(got, want):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

        base = model(comfy, name)
        sample_once(lora(base, name), name, x, ctx, extra)  # a LoRA'd clone is loaded as the node runs
        close(sample_once(optimize(nodes, base, precision="fp8"), name, x, ctx, extra), own)
        first = optimize(nodes, lora(base, name), precision="fp8")
        close(sample_once(first, name, x, ctx, extra), full)
        second = optimize(nodes, lora(base, name, 0.5), precision="fp8")  # the re-queue: `first` is loaded
        close(sample_once(second, name, x, ctx, extra), half)
        optimized = optimize(nodes, base, precision="fp8")
        close(sample_once(optimized, name, x, ctx, extra), own)
        sample_once(base, name, x, ctx, extra)  # the plain model in between
        close(sample_once(lora(optimized, name), name, x, ctx, extra), full)  # Optimize -> LoRA -> KSampler
        close(sample_once(optimized, name, x, ctx, extra), own)


def test_weights_comfyui_patches_per_call_take_its_own_forward(comfy, nodes, eight_bit_here):
    """Low-VRAM LoRA: ComfyUI computes the weight in the Linear's forward (weight_function): the copies step aside
    and ComfyUI's forward runs, whatever the option."""
    patcher = model(comfy, "flux")
    x, ctx, extra = dit_inputs()
    linears = [m for m in patcher.model.modules() if isinstance(m, nn.Linear)]
    for m in linears:
        m.weight_function = [lambda w: w * 0.5]
    try:
        plain = evaluate(optimize(nodes, patcher), "flux", x, ctx, extra)
        dispatch.reset_stats()
        got = evaluate(optimize(nodes, patcher, precision="fp8"), "flux", x, ctx, extra)
        assert "quantize_rows" not in dispatch.stats()
    finally:
        for m in linears:
            del m.weight_function
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-5)


class HostLayout(torch.Tensor):
    """A weight in a host's own quantized layout (ComfyUI's QuantizedTensor): only the host's forward reads it."""


def test_comfyuis_own_formats(comfy, nodes, eight_bit_here):
    """A weight ComfyUI keeps in fp8 and casts per call (weight_dtype fp8_e4m3fn, manual cast) is quantized from
    those fp8 values, the weight ComfyUI computes with; a weight in ComfyUI's own quantized layout, or an older
    ComfyUI's scaled fp8 weight (scale_weight, multiplied in per call), stays ComfyUI's, and the node says so."""
    patcher = model(comfy, "flux")
    x, ctx, extra = dit_inputs()
    blocks = patcher.model.diffusion_model
    stored = blocks.double_blocks[0].img_attn.qkv
    stored.weight = nn.Parameter(stored.weight.detach().to(torch.float8_e4m3fn), requires_grad=False)
    stored.comfy_cast_weights = True
    layout = blocks.single_blocks[0].linear2
    layout.weight = nn.Parameter(layout.weight.detach().as_subclass(HostLayout), requires_grad=False)
    blocks.double_blocks[1].txt_attn.proj.scale_weight = nn.Parameter(torch.ones(()), requires_grad=False)
    probe = patcher.clone()
    notes = comfy_patch.patch_model_patcher(probe, precision="fp8", cuda_graph=False)
    assert ("precision=fp8: 2 linear layers of the transformer blocks stay ComfyUI's, computed in its own quantized "
            "format (a scaled fp8 checkpoint, comfy-kitchen's or its mixed-precision layouts), which only its forward "
            "reads") in notes
    layers = eight_bit_patches(probe)
    assert "diffusion_model.double_blocks.0.img_attn.qkv" in layers
    assert not {"diffusion_model.single_blocks.0.linear2", "diffusion_model.double_blocks.1.txt_attn.proj"} & set(
        layers)
    copy = layers["diffusion_model.double_blocks.0.img_attn.qkv"]
    rows = torch.randn(3, stored.in_features)
    as_computed = nn.Linear(stored.in_features, stored.out_features)
    as_computed.weight, as_computed.bias = nn.Parameter(stored.weight.float()), stored.bias
    with config.override(log_fallbacks=False):
        assert torch.equal(copy(rows), RocmQuantizedLinear.from_module(as_computed, "e4m3fn")(rows))
    # a scale_weight appearing later on a layer the node took (another load) sends its calls to ComfyUI's forward
    taken = layers["diffusion_model.double_blocks.0.img_attn.proj"]
    unpatched(taken).scale_weight = nn.Parameter(torch.full((), 2.0), requires_grad=False)
    rows = torch.randn(3, taken.in_features)
    with config.override(log_fallbacks=False):
        dispatch.reset_stats()
        assert torch.equal(taken(rows), unpatched(taken)(rows))
        assert "quantize_rows" not in dispatch.stats()


# ---- on the GPU: the real format check, the quantize kernel, torch's 8-bit GEMMs ---------------------------------

def gpu_model(comfy, name):
    """(the stand-in in bf16 on the GPU, its inputs, the 8-bit option the GPU has: fp8, else int8)."""
    fmt, _ = precision.number_format(torch.device("cuda"), "fp8")
    wider = {"hidden_size": 64, "axes_dim": (8, 12, 12)} if family(name) == "flux" else {}  # heads of 32
    patcher = model(comfy, name, "cuda", torch.bfloat16, **wider)
    return patcher, dit_inputs(2, "cuda", torch.bfloat16), "fp8" if fmt else "int8"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sd35m", "flux"])
def test_gpu_fp8_output_agrees_with_the_unquantized_node(comfy, nodes, name):
    """bf16, every selected layer 8-bit (precision_layers="all"), fp8 where the GPU has it (int8 elsewhere), strict:
    the output within the diffusers DiT precision GPU test's tolerance (0.1 of the largest value) of the node's
    output without precision, the quantize kernel and the 8-bit weights on the GPU, nothing falling back."""
    patcher, (x, ctx, extra), choice = gpu_model(comfy, name)
    with config.override(strict=True):
        unquantized = evaluate(optimize(nodes, patcher), name, x, ctx, extra).float()
        optimized = optimize(nodes, patcher, precision=choice, precision_layers="all")
        layers = eight_bit_patches(optimized)
        dispatch.reset_stats()
        got = evaluate(optimized, name, x, ctx, extra).float()
        stats = dispatch.stats()
    assert layers and set(stats["quantize_rows"]) == {"rocm_sd"}, stats
    assert all(m.rocm_sd_weight_q is not None and m.rocm_sd_weight_q.is_cuda for m in layers.values())
    assert torch.isfinite(got).all() and 0 < error(got, unquantized) < 0.1


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sd35m", "flux"])
def test_gpu_graph_replays_of_the_8bit_layers_match_the_eager_evaluation(comfy, nodes, name):
    from rocm_sd.patch.comfy_graph import graph_stats

    patcher, (x, ctx, extra), choice = gpu_model(comfy, name)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher, precision=choice, precision_layers="all")
    optimized.patch_model()
    try:
        with config.override(strict=True):
            got = run(optimized, x, ctx, extra, family(name))
            wrapper = optimized.model_options["model_function_wrapper"]
            t = torch.linspace(0.3, 0.8, 2, device="cuda")
            conditioning = {"c_crossattn": ctx, "transformer_options": optimized.model_options["transformer_options"],
                            **(extra if family(name) == "flux" else {"y": extra["y"]})}
            with torch.inference_mode():
                replays = [wrapper(optimized.model.apply_model, {"input": x, "timestep": t, "c": conditioning,
                                                                 "cond_or_uncond": [0, 0]}) for _ in range(3)]
    finally:
        optimized.unpatch_model()
    for replay in replays:
        torch.testing.assert_close(replay, got)
    stats = graph_stats(optimized)
    assert stats["graph captures"] == 1 and stats["graph replays"] == 3, stats
