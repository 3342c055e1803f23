"""The ComfyUI node's precision option: the UNet's linear layers as 8-bit GEMMs of the weights ComfyUI has now
(modules/quantized_linear.QuantizedHostCopy, patch/comfy.quantized_swaps), against the stand-in of ComfyUI's
interfaces (tests/standins). A CPU has no 8-bit GEMMs: with the device check answered, the layers compute the same
product from the dequantized operands (modules/quantized_linear.linear_8bit)."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from rocm_sd import config, dispatch
from rocm_sd.graphs import GraphedCall
from rocm_sd.modules.host_copies import quantized_linear_copy
from rocm_sd.modules.pointwise import is_pointwise
from rocm_sd.modules.quantized_linear import FEW_ROWS, RocmQuantizedLinear
from rocm_sd.patch import ldm_swaps, precision

from tests.comfyui_standin import model_inputs, run_model, run_patched_with_stats, standin_model


@pytest.fixture
def int8_here(monkeypatch):
    """The device check answered for the CPU: int8 (the stand-in's context of 24 features fits int8's multiple of 8)."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: ("int8", None))


def _optimized(nodes, patcher, **options):
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False, precision="int8", **options)
    return optimized


def test_the_linears_run_as_8bit_gemms_and_unpatching_restores_the_model(comfy, nodes, int8_here):
    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    reference = run_model(patcher, x, ctx)
    originals = dict(patcher.model.named_modules())
    state = {k: v.clone() for k, v in patcher.model.state_dict().items()}
    optimized = _optimized(nodes, patcher)
    quantized = sorted(k for k, m in optimized.object_patches.items() if hasattr(m, "rocm_sd_refresh"))
    assert any(k.endswith("attn1.to_q") for k in quantized) and any(k.endswith("attn2.to_k") for k in quantized)
    assert any(k.endswith("ff.net.2") for k in quantized) and any(k.endswith("proj_in") for k in quantized)
    assert any(k.endswith("skip_connection") or k.endswith("skip") for k in quantized) or not any(
        is_pointwise(m, any_class=True) for m in patcher.model.modules())
    assert not any(part in k for k in quantized for part in FEW_ROWS)
    optimized.patch_model()
    try:
        with config.override(log_fallbacks=False):
            dispatch.reset_stats()
            got = run_model(optimized, x, ctx)
        assert dispatch.stats()["quantize_rows"]["torch"] > 0
        # the 8-bit weights are buffers of the copies, never in what ComfyUI saves or maps LoRA keys from
        assert optimized.model.state_dict().keys() == state.keys()
    finally:
        optimized.unpatch_model()
    assert torch.isfinite(got).all()
    error = (got - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.1, error
    assert dict(patcher.model.named_modules()) == originals
    assert all(torch.equal(v, state[k]) for k, v in patcher.model.state_dict().items())
    assert torch.equal(run_model(patcher, x, ctx), reference)


def test_each_copy_is_the_8bit_layer_of_the_current_weight(comfy, int8_here):
    """A copy computes what RocmQuantizedLinear of the module computes, bit for bit, and follows ComfyUI's weight
    patching: LoRA sets a new Parameter through the object-patched path; hooks may copy into it in place."""
    import comfy.utils as comfy_utils

    patcher = standin_model(comfy)
    linear = patcher.model.diffusion_model.middle_block[1].transformer_blocks[0].attn1.to_q
    copy = quantized_linear_copy(linear, "int8")
    x = torch.randn(2, 7, linear.in_features)
    with config.override(log_fallbacks=False):
        assert torch.equal(copy(x), RocmQuantizedLinear.from_module(linear, "int8")(x))
        first = copy.rocm_sd_weight_q
        assert torch.equal(copy(x), RocmQuantizedLinear.from_module(linear, "int8")(x))
        assert copy.rocm_sd_weight_q is first  # unchanged weight: quantized once

        holder = nn.Module()
        holder.layer = copy
        patched = nn.Parameter(linear.weight * 1.5, requires_grad=False)
        comfy_utils.set_attr(holder, "layer.weight", patched)  # ComfyUI's set_attr_param on the patched path
        assert linear.weight is patched  # one slot, the module's own: ComfyUI restores its backup the same way
        expected = nn.Linear(linear.in_features, linear.out_features, bias=False)
        expected.weight = patched
        assert torch.equal(copy(x), RocmQuantizedLinear.from_module(expected, "int8")(x))

        with torch.no_grad():
            patched.mul_(-1)  # in place: a new version
        assert torch.equal(copy(x), RocmQuantizedLinear.from_module(expected, "int8")(x))
        assert copy.rocm_sd_weight_q is not first


def test_copies_read_the_hosts_flags_from_the_module_and_formats_do_not_clash():
    """ComfyUI sets its load flags (low-VRAM casting, weight functions, patched-weights) on whichever face its path
    holds when it loads, and wipes them on the other when it unloads: an 8-bit copy must see the module's flags as
    they are now, or it quantizes a weight the host has not patched yet (wrong images). Two copies of one module in
    two formats keep apart 8-bit weights; a weight swapped back is quantized again by either copy."""
    linear = nn.Linear(16, 32)
    copy = quantized_linear_copy(linear, "int8")
    other = quantized_linear_copy(linear, "e4m3fn")
    x = torch.randn(3, 16)
    with config.override(log_fallbacks=False):
        linear.weight_function = [lambda w: w * 2]  # a LoRA applied per call, set on the module after the copy
        linear.comfy_cast_weights = True
        assert copy.weight_function is linear.weight_function and copy.comfy_cast_weights
        copy.comfy_cast_weights = False  # and set through the copy: the module's own flag
        assert linear.comfy_cast_weights is False
        del linear.weight_function, linear.comfy_cast_weights

        expected = RocmQuantizedLinear.from_module(linear, "int8")(x)
        assert torch.equal(copy(x), expected)
        assert torch.equal(other(x), RocmQuantizedLinear.from_module(linear, "e4m3fn")(x))
        assert torch.equal(copy(x), expected)  # the fp8 copy's weights did not overwrite the int8 ones

        original = linear.weight
        linear.weight = nn.Parameter(original * 3, requires_grad=False)  # another clone's patch, through one copy
        tripled = copy(x)
        linear.weight = original  # restored through the module, the other copy never called in between
        assert torch.equal(copy(x), expected) and not torch.equal(tripled, expected)


def test_copies_take_empty_and_nan_inputs_and_leave_other_dtypes_to_the_host():
    with config.override(log_fallbacks=False):
        linear = quantized_linear_copy(nn.Linear(16, 32), "e4m3fn")
        conv = quantized_linear_copy(nn.Conv2d(16, 32, 1), "int8")
        assert linear(torch.empty(2, 0, 16)).shape == (2, 0, 32)
        assert conv(torch.empty(0, 16, 3, 3)).shape == (0, 32, 3, 3)
        x = torch.randn(3, 16)
        x[1, 2] = float("nan")
        assert linear(x).isnan().any(1).tolist() == [False, True, False]  # the NaN row only, never hidden
        dispatch.reset_stats()
        wide = nn.Linear(16, 32).double()
        torch.testing.assert_close(quantized_linear_copy(wide, "int8")(torch.ones(2, 16, dtype=torch.float64)),
                                   wide(torch.ones(2, 16, dtype=torch.float64)), rtol=0, atol=0)
        assert "quantize_rows" not in dispatch.stats()  # float64: the host's own forward
    class HostLayout(torch.Tensor):  # a host's own quantized weight layout (ComfyUI's QuantizedTensor)
        pass

    layout = nn.Linear(16, 32)
    layout.weight = nn.Parameter(layout.weight.detach().as_subclass(HostLayout), requires_grad=False)
    root = nn.Sequential(layout, nn.Linear(16, 16))
    assert list(ldm_swaps.quantized_linear_swaps(root, "int8", 8)) == ["1"]
    with pytest.raises(TypeError, match="1x1"):
        quantized_linear_copy(nn.Conv2d(16, 32, 3), "int8")
    with pytest.raises(ValueError, match="format 'fp4'"):
        quantized_linear_copy(nn.Linear(16, 32), "fp4")


def test_norms_write_the_quantized_output_their_consumers_take(comfy, nodes, int8_here):
    """Each transformer block's norm1 / norm2 / norm3 feeds only 8-bit layers: its kernel writes the quantization,
    the layers quantize nothing, and the result is bit for bit the one where each layer quantizes itself."""
    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    optimized = _optimized(nodes, patcher)
    norms = [m for k, m in optimized.object_patches.items() if getattr(m, "rocm_sd_quantized_output", None)]
    blocks = sum(type(m).__name__ == "BasicTransformerBlock" for m in patcher.model.modules())
    assert len(norms) == 3 * blocks and blocks > 0
    # layer_norm off: the LayerNorms stay ComfyUI's own, and the 8-bit layers quantize their inputs themselves
    without = _optimized(nodes, patcher, layer_norm=False)
    assert not any(k.rsplit(".", 1)[-1].startswith("norm") and "transformer_blocks" in k
                   for k in without.object_patches)
    assert any(hasattr(m, "rocm_sd_refresh") for m in without.object_patches.values())
    optimized.patch_model()
    try:
        with config.override(log_fallbacks=False):
            dispatch.reset_stats()
            fused = run_model(optimized, x, ctx)
            stats = dispatch.stats()
            assert stats["layer_norm_quantize_rows"]["torch"] == 3 * blocks
            for norm in norms:
                norm.rocm_sd_quantized_output = None
            dispatch.reset_stats()
            alone = run_model(optimized, x, ctx)
            assert dispatch.stats()["quantize_rows"]["torch"] > stats["quantize_rows"]["torch"]
    finally:
        optimized.unpatch_model()
    assert torch.equal(fused, alone)


def test_layers_go_back_to_comfyuis_forward_where_measured_faster(comfy, nodes, int8_here, monkeypatch):
    """precision_layers="measured" (the node's default): at its first call each 8-bit copy asks the tuning database
    about its shape; where the answer is torch it runs ComfyUI's own forward from then on (8-bit weight freed) and
    the norm in front stops writing quantized output. With "all" nobody asks."""
    from tests.test_precision import _Database, _shape

    database = _Database(lambda key: dispatch.TORCH if _shape(key)["shared"] == "3" else None)
    monkeypatch.setattr(dispatch, "_tuning", database)
    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    reference = run_model(patcher, x, ctx)
    optimized = _optimized(nodes, patcher)
    layers = {k: m for k, m in optimized.object_patches.items() if hasattr(m, "rocm_sd_refresh")}
    self_attention = {k for k in layers if k.endswith(("attn1.to_q", "attn1.to_k", "attn1.to_v"))}
    optimized.patch_model()
    try:
        with config.override(log_fallbacks=False):
            first = run_model(optimized, x, ctx)
            asked = len(database.asked)
            second = run_model(optimized, x, ctx)
    finally:
        optimized.unpatch_model()
    kept = {k for k, m in layers.items() if getattr(m, "rocm_sd_fp16", False)}
    assert kept == self_attention and kept
    assert all(layers[k].rocm_sd_weight_q is None for k in kept)
    assert asked == len(layers) == len(database.asked)
    shapes = [_shape(key) for key in database.asked]
    text_layers = sum(k.endswith(("attn2.to_k", "attn2.to_v")) for k in layers)
    # one quantization shared by norm1's three consumers, and by every cross-attention key and value (the stand-in's
    # context is no inference tensor, so remember_rows keeps it)
    assert {(s["input"], s["shared"]) for s in shapes} == {("norm", "3"), ("norm", "1"), ("rows", "1"),
                                                           ("rows", str(text_layers))}
    norms = {k: m for k, m in optimized.object_patches.items() if k.endswith(("norm1", "norm2"))
             and "transformer_blocks" in k}
    assert norms and all((m.rocm_sd_quantized_output is None) == k.endswith("norm1") for k, m in norms.items())
    assert torch.equal(first, second) and torch.isfinite(first).all()
    error = (first - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.1, error
    database.asked.clear()
    every = _optimized(nodes, patcher, precision_layers="all")
    every.patch_model()
    try:
        with config.override(log_fallbacks=False):
            run_model(every, x, ctx)
    finally:
        every.unpatch_model()
    assert database.asked == []
    assert not any(getattr(m, "rocm_sd_fp16", False) for m in every.object_patches.values())


def test_layers_comfyui_patches_per_call_take_its_own_forward(comfy, nodes, int8_here):
    """Low-VRAM LoRA: ComfyUI applies the patch in the forward (weight_function); the copy steps aside."""
    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    optimized = _optimized(nodes, patcher, group_norm=False, layer_norm=False, attention=False, channels_last=False)
    plain = _optimized(nodes, patcher, group_norm=False, layer_norm=False, attention=False, channels_last=False)
    plain.object_patches.clear()  # the same options without the 8-bit layers
    plain.patch_model()
    reference = run_model(plain, x, ctx)
    plain.unpatch_model()
    optimized.patch_model()
    try:
        for module in optimized.model.modules():
            if hasattr(module, "rocm_sd_refresh"):
                module.weight_function = [lambda w: w * 1.0]
        dispatch.reset_stats()
        got = run_model(optimized, x, ctx)
        assert "quantize_rows" not in dispatch.stats()
    finally:
        optimized.unpatch_model()
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)


def test_without_8bit_gemms_the_node_says_why_once_and_keeps_the_rest(comfy, nodes, caplog):
    patcher = standin_model(comfy)
    with caplog.at_level(logging.WARNING, logger="rocm_sd.comfyui"):
        (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False, precision="fp8")
    assert not any(hasattr(m, "rocm_sd_refresh") for m in optimized.object_patches.values())
    assert any(k.endswith("norm1") for k in optimized.object_patches)
    messages = [r.getMessage() for r in caplog.records if "precision=fp8 not applied" in r.getMessage()]
    assert messages and "8-bit GEMMs need a GPU" in messages[0]


def test_a_graph_signature_sees_a_new_quantization(comfy, int8_here):
    """graphs.GraphedCall brings derived weights up to date before it compares signatures: a weight replaced or
    changed in place is quantized again into new buffers, so the graph of the old quantization is not replayed."""
    patcher = standin_model(comfy)
    unet = patcher.model.diffusion_model
    block = unet.middle_block[1].transformer_blocks[0]
    block.attn1.to_q = quantized_linear_copy(block.attn1.to_q, "int8")
    call = GraphedCall(lambda *a: None, unet, "test")
    first = call._model_key()
    assert call._model_key() == first
    with torch.no_grad():
        block.attn1.to_q.weight.mul_(2)
    changed = call._model_key()
    assert changed != first and call._model_key() == changed
    block.attn1.to_q.weight = nn.Parameter(block.attn1.to_q.weight * 3, requires_grad=False)
    replaced = call._model_key()
    assert replaced not in (first, changed) and call._model_key() == replaced


@pytest.mark.gpu
def test_fp8_on_the_gpu_runs_the_8bit_gemms(comfy, nodes):
    """On a GPU with FP8 (int8 elsewhere): the real format check, the quantize kernels and torch's 8-bit GEMMs."""
    patcher = standin_model(comfy, "cuda", torch.float16, channels=32, context_dim=32)
    x, ctx = model_inputs("cuda", torch.float16)
    ctx = torch.nn.functional.pad(ctx, (0, 8))
    reference = run_model(patcher, x, ctx)
    fmt, _ = precision.number_format(torch.device("cuda"), "fp8")
    choice = "fp8" if fmt else "int8"
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher, precision=choice, cuda_graph=False,
                                                        precision_layers="all")
    assert any(hasattr(m, "rocm_sd_refresh") for m in optimized.object_patches.values())
    got, stats = run_patched_with_stats(optimized, x, ctx)
    blocks = sum(type(m).__name__ == "BasicTransformerBlock" for m in patcher.model.modules())
    assert stats["layer_norm_quantize_rows"] == {"rocm_sd": 3 * blocks}
    assert set(stats["quantize_rows"]) == {"rocm_sd"}
    assert torch.isfinite(got).all()
    assert (got.float() - reference.float()).abs().max().item() < 0.2 * reference.float().abs().max().item()


@pytest.mark.gpu
def test_measured_choice_on_the_gpu_settles_before_the_graph(comfy, nodes, monkeypatch):
    """The node with graphs and precision_layers="measured": the copies decide in the warm-up calls, the captured
    graph replays ComfyUI's own forward where the database said torch, and replays match the eager evaluation."""
    from rocm_sd.patch.comfy_graph import graph_stats

    from tests.test_comfyui_graph import eager_call, sampler_call
    from tests.test_precision import _Database, _shape

    fmt, _ = precision.number_format(torch.device("cuda"), "fp8")
    database = _Database(lambda key: dispatch.TORCH if _shape(key)["shared"] == "3" else None)
    monkeypatch.setattr(dispatch, "_tuning", database)
    patcher = standin_model(comfy, "cuda", torch.float16, channels=32, context_dim=32)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher, precision="fp8" if fmt else "int8")
    layers = {k: m for k, m in optimized.object_patches.items() if hasattr(m, "rocm_sd_refresh")}
    optimized.patch_model()
    try:
        with config.override(strict=True):
            for seed in range(3):
                x, ctx = model_inputs("cuda", torch.float16, seed)
                ctx = torch.nn.functional.pad(ctx, (0, 8))
                torch.testing.assert_close(sampler_call(optimized, x, ctx), eager_call(optimized, x, ctx))
    finally:
        optimized.unpatch_model()
    kept = {k for k, m in layers.items() if getattr(m, "rocm_sd_fp16", False)}
    assert kept == {k for k in layers if k.endswith(("attn1.to_q", "attn1.to_k", "attn1.to_v"))} and kept
    assert all(layers[k].rocm_sd_weight_q is None for k in kept)
    stats = graph_stats(optimized)
    assert stats["graph captures"] == 1 and stats["graph replays"] == 3, stats
